// Internal: Heartbeats, the failure detector's driver (its policy is Liveness,
// liveness.h): every interval it pings the peers it has not heard from and declares dead
// those silent for the timeout.
//
// Contract
//   - Heard(rank): a frame came from that peer (on the I/O thread; one relaxed atomic).
//     Answer(conn) answers a ping at once, on the I/O thread that read it (never behind a
//     handler).
//   - Start() schedules the first tick on the agent's TimerQueue when the interval is
//     positive (0 turns heartbeats off; Liveness then still counts, with a 1 s interval,
//     and nothing ticks). Each tick (on the timer thread) closes the connections of the
//     peers declared dead, with UNAVAILABLE naming them and saying why (the agent's close
//     path then fails their calls and tells every layer), and a line on stderr; then it
//     hands the pings to a sender thread of its own: a send may wait for a connection's
//     writer (a large frame to a slow or frozen peer), and the timer thread runs every
//     call's deadline and the next tick, while the worker pool's threads may all be busy
//     in handlers on both ends of an idle connection.
//   - A tick does nothing once `closed()` says the agent closed; Stop() shuts the sender
//     down (the agent shuts the TimerQueue down).
//   - pings_sent() and declared_dead() count for the agent's statistics.
//   - Thread-safe.
#ifndef GRADWIRE_RPC_SRC_CLUSTER_HEARTBEATS_H_
#define GRADWIRE_RPC_SRC_CLUSTER_HEARTBEATS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "cluster/liveness.h"
#include "cluster/peers.h"
#include "gradwire/rpc/executor.h"
#include "gradwire/rpc/timer_queue.h"
#include "gradwire/rpc/transport.h"

namespace gw::rpc::internal {

class Heartbeats {
 public:
  // REQUIRES: peers and timers outlive this unit; timeout >= 2 * interval when interval > 0.
  Heartbeats(std::string self_name, int capacity, absl::Duration interval, absl::Duration timeout, Peers& peers,
             TimerQueue& timers, std::function<bool()> closed);

  void Heard(int rank) { liveness_.Heard(rank); }
  static void Answer(Connection& conn);
  void Start();
  void Stop() { sender_.Shutdown(); }

  int64_t pings_sent() const { return pings_sent_.load(std::memory_order_relaxed); }
  int64_t declared_dead() const { return declared_dead_.load(std::memory_order_relaxed); }

 private:
  void Tick();

  const std::string self_name_;
  const bool enabled_;
  Liveness liveness_;  // Heard on I/O threads; ticked on the timer thread
  Peers& peers_;
  TimerQueue& timers_;
  const std::function<bool()> closed_;
  ThreadPool sender_;  // sends the pings
  std::atomic<int64_t> pings_sent_{0};
  std::atomic<int64_t> declared_dead_{0};  // for silence, not for closed connections
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CLUSTER_HEARTBEATS_H_
