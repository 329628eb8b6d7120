// Fault injection for transports: the plan of faults (FaultSpec, parsed from strings such
// as "drop:0.01,delay:5ms,close_after:500") and the FaultInjector that transports consult
// and tests control. leveldb's fault_injection_test.cc, for a network: any Transport is
// wrapped by a decorator (rpc/src/transport/fault/) when TransportOptions::faults is set,
// so whole programs run under faults (AgentOptions::FromEnv reads GRADWIRE_FAULTS).
//
// Contract
//   - The decorator runs its own link protocol over the real connection: every frame
//     carries a link header (type, sequence number, cumulative ack, crc32 of the header
//     and tensor bytes). Faults are applied to frames on that link, at the sender:
//       drop:P          a frame is lost with probability P (< 1); data frames are
//                       retransmitted until acknowledged (after `rto`, backing off), so
//                       the layer above sees only delay: results stay exact.
//       delay:D         every frame waits D, or a uniform time in [D1, D2] with
//       delay:D1-D2     delay:D1-D2; order is kept (unless reorder is on).
//       duplicate:P     a frame is sent twice; the receiver drops the copy by sequence.
//       reorder:W       frames are released in random order within windows of W frames
//                       (a window not filled within 1 ms is released as it is); the
//                       receiver's reorder buffer restores the order.
//       corrupt:P       one bit of a frame is flipped; the receiver's checksum catches it
//                       and closes the connection with DATA_LOSS naming the peer. A
//                       corrupted message is never delivered.
//       stall:D         after stall_after:N frames (default 0) each connection stops
//       stall_after:N   delivering, both ways, for D ("inf": until Unstall()): frames it
//                       would send wait, frames it receives are discarded unacknowledged
//                       (their sender retransmits them later). Once per connection.
//       close_after:N   each connection is closed with UNAVAILABLE "connection closed by
//                       fault injection after N frames" once it carried N data frames
//                       (sent plus delivered); the peer learns the reason.
//       partition:a+b/c+d  workers a and b cannot talk to c and d: such connections are
//                       closed (UNAVAILABLE) right after the link hello, which carries
//                       each side's worker name (TransportOptions::self_name). Repeatable.
//       rto:D           retransmission timeout (default 20ms; it adapts upwards to the
//                       measured round trip, and grows with a frame's size).
//       seed:N          seeds the randomness (each connection draws from its own
//                       generator, seeded from N and the order connections were made).
//     Items are comma-separated name:value pairs; an empty string is no fault. Errors are
//     INVALID_ARGUMENT naming the bad item and listing the valid forms.
//   - Frames are data (user messages), acks, and the control frames hello and goodbye;
//     drop, delay, duplicate, reorder and corrupt apply to data and acks, stalls to data
//     and acks, and control frames travel unharmed.
//   - FaultInjector is shared by the transports of a process and the test that controls
//     them. Set, Partition, Heal, Stall and Unstall take effect at once on existing
//     connections (partitioned ones close, stalled ones resume); stats() counts what
//     happened and AwaitStats waits for a condition on the counters (no polling, no sleep).
//   - Both ends of a connection must use the decorator (it changes the bytes on the
//     wire); one that does not is refused with DATA_LOSS ("expected the fault link's
//     hello").
//   - Thread-safe.
#ifndef GRADWIRE_RPC_FAULTS_H_
#define GRADWIRE_RPC_FAULTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gw::rpc {

// Workers in `a` cannot talk to workers in `b` (names as in AgentOptions::name).
struct FaultPartition {
  std::vector<std::string> a, b;
};

struct FaultSpec {
  double drop = 0;                                    // probability, [0, 1)
  absl::Duration delay_min = absl::ZeroDuration();    // delay:D sets both
  absl::Duration delay_max = absl::ZeroDuration();
  double duplicate = 0;                               // probability, [0, 1]
  int reorder = 0;                                    // window in frames; 0 or 1: off
  double corrupt = 0;                                 // probability, [0, 1]
  absl::Duration stall = absl::ZeroDuration();        // zero: none; infinite: until Unstall
  int64_t stall_after = 0;                            // frames before the stall
  int64_t close_after = 0;                            // 0: never
  std::vector<FaultPartition> partitions;
  absl::Duration rto = absl::Milliseconds(20);
  std::optional<uint64_t> seed;                       // unset: from std::random_device

  // The canonical string, which ParseFaults reads back to an equal spec.
  std::string ToString() const;
};

// Parses comma-separated name:value items (see the contract above).
absl::StatusOr<FaultSpec> ParseFaults(absl::string_view text);

// What the fault transports of one injector did, summed over their connections.
struct FaultStats {
  uint64_t frames_sent = 0;           // data frames put on the link the first time
  uint64_t frames_delivered = 0;      // data frames delivered to the layer above
  uint64_t dropped = 0;               // frames (data or ack) lost on the link
  uint64_t retransmitted = 0;         // data frames sent again after their timeout
  uint64_t duplicated = 0;            // frames the link sent twice
  uint64_t duplicates_discarded = 0;  // data frames a receiver had already seen
  uint64_t reordered = 0;             // frames released out of their order
  uint64_t corrupted = 0;             // frames with a flipped bit
  uint64_t corruptions_detected = 0;  // frames refused by a receiver's checksum
  uint64_t stalled = 0;               // frames held or discarded by a stall
  uint64_t connections_closed = 0;    // by close_after, a partition or a bad checksum

  std::string ToString() const;
};

class FaultInjector {
 public:
  explicit FaultInjector(FaultSpec spec = {});
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  // Replaces the whole plan (partitions included).
  void Set(FaultSpec spec);
  FaultSpec spec() const;

  // Adds a partition between the workers named in `a` and those in `b`; their open
  // connections close. Heal() removes every partition (of Set and of Partition).
  void Partition(std::vector<std::string> a, std::vector<std::string> b);
  void Heal();
  // Every connection stops delivering, both ways, for `duration` (infinite: until
  // Unstall). Unstall() also ends the stalls of stall:D, and the connections open then
  // do not stall again (new ones follow the plan).
  void Stall(absl::Duration duration = absl::InfiniteDuration());
  void Unstall();

  FaultStats stats() const;
  // Waits until `until(stats)` holds (true) or `deadline` passes (false). `until` runs
  // with the injector's lock held: it must only read the counters.
  bool AwaitStats(const std::function<bool(const FaultStats&)>& until, absl::Time deadline) const;

  // ---- for the fault transport (rpc/src/transport/fault/) ----
  std::shared_ptr<const FaultSpec> plan() const;
  bool Partitioned(const std::string& x, const std::string& y) const;
  // The end of the stall of Stall() (InfinitePast when none), and how many times
  // Unstall was called (connections end their own stalls when it changes).
  absl::Time stalled_until() const;
  uint64_t unstalls() const;
  // A seed for one connection's generator.
  uint64_t NextSeed();
  void Count(uint64_t FaultStats::*counter, uint64_t n = 1);
  // `changed` runs after every Set, Partition, Heal, Stall and Unstall, on the calling
  // thread, without the injector's lock. RemoveObserver waits for a running call.
  uint64_t AddObserver(std::function<void()> changed);
  void RemoveObserver(uint64_t id);

 private:
  void Notify();

  mutable absl::Mutex mu_;
  std::shared_ptr<const FaultSpec> plan_ ABSL_GUARDED_BY(mu_);
  absl::Time stalled_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t unstalls_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t connections_ ABSL_GUARDED_BY(mu_) = 0;
  FaultStats stats_ ABSL_GUARDED_BY(mu_);

  // Held while observers run, so that RemoveObserver never returns during a call.
  absl::Mutex observers_mu_;
  std::map<uint64_t, std::function<void()>> observers_ ABSL_GUARDED_BY(observers_mu_);
  uint64_t next_observer_ ABSL_GUARDED_BY(observers_mu_) = 1;
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_FAULTS_H_
