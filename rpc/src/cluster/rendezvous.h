// Internal: Rendezvous, how an agent finds the other workers of its group.
//
// Contract
//   - Join connects to the rendezvous store at options.rendezvous (rank 0 first starts
//     it there when options.host_store; port 0 picks a free one, see store_address()).
//     An options.rendezvous "etcd://HOST:PORT/JOB" is an etcd cluster (etcd_store.h):
//     nobody hosts it (host_store is ignored) and JOB is the namespace of every key.
//   - Announce(self) publishes this worker's record (name, transport address, pid, GPUs) under
//     "<run_id>/worker/<rank>"; AwaitAll(deadline) returns every rank's record once all
//     have announced, or DEADLINE_EXCEEDED naming the ranks still missing, or
//     INVALID_ARGUMENT when two ranks use one name.
//   - Lookup(rank) re-reads a rank's record: a worker restarted under the same rank
//     announces its new address there.
//   - Elastic groups (agent.h, AgentOptions::join): PublishGroup(world_size, capacity)
//     (rank 0, once the group formed) says how large the running group is and may grow;
//     ReadGroup waits for it. ClaimRank() gives a worker that joins the next free rank
//     (world_size, world_size + 1, ...: an atomic counter, so two joiners never share
//     one), or RESOURCE_EXHAUSTED once the ranks reach the capacity. Ranks(world_size, capacity)
//     is how many ranks were handed out so far (claims refused as over capacity not counted). MarkLeft(rank) records
//     that a worker left (HasLeft reads it); FindMembers(world_size, capacity, self, deadline) is what a joiner knows
//     of the group: the record of every rank handed out but its own (Start's group
//     awaited, joiners that never announced skipped), and which of them left.
//   - Key(what, rank) is "<run_id>/<what><rank>": other protocols on the store (the
//     shutdown barrier) use the same namespace.
//   - keys_outlive_job(): the store is not hosted by the job (etcd), so what the job
//     writes stays after it. ForgetRun() then removes every "<run_id>/" key in one
//     request (the shutdown barrier's last worker out does, so the job's name can be
//     used again); with a hosted store it does nothing.
//   - RendezvousHost(address) is the host of either form of address (the agent picks
//     the interface that reaches it); INVALID_ARGUMENT saying the expected forms.
//   - Progress: while Join waits for the store to answer, AwaitAll for the other ranks,
//     or ReadGroup for the group to form, a line says whom it waits for and where (to
//     stderr unless progress.say is given):
//       - Join: the store's address, after progress.every (5 s), then after twice as long
//         each time, up to 60 s apart: while a hosted store is down every rank waits for
//         it, and their lines thin out. Join connects in one attempt until it gives up
//         (gRPC redials refused connections meanwhile), so authenticating with the store
//         or probing etcd always has the time that is left, never a slice of it.
//       - AwaitAll: every progress.every, the ranks still missing and who joined, said by
//         one rank for the group: the first that waited a whole interval (an atomic counter
//         "<run_id>/progress_speaker" in the store, added to once by each rank that waits
//         that long). It alone reads every rank's record per interval (world_size Gets);
//         the others make one Wait call per interval and nothing more. If that rank dies
//         while the others wait, nobody says more until the deadline, where every rank's
//         error names the missing ranks (one read of every record, once).
//       - ReadGroup: every progress.every, that the group has not formed yet.
//   - A worker that joins (options.join) needs a running job: Join retries a store address
//     where nothing listens (connection refused: the job has not started its store yet,
//     e.g. every pod of a job started at once) or that does not answer for
//     progress.join_store_wait (kJoinStoreWait, 10 s), saying so as above, then fails
//     with UNAVAILABLE saying which (nothing listens / did not answer) and that the job
//     may have finished. An etcd store has no such limit (it outlives jobs).
//   - Close() drops the store client and stops the store it hosts. Thread-safe.
#ifndef GRADWIRE_RPC_SRC_CLUSTER_RENDEZVOUS_H_
#define GRADWIRE_RPC_SRC_CLUSTER_RENDEZVOUS_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/rpc/store.h"
#include "gradwire/rpc/worker.h"
#include "store/etcd_store.h"

namespace gw::rpc::internal {

// How long a worker that joins waits for the store of the job it joins (see the contract).
inline constexpr absl::Duration kJoinStoreWait = absl::Seconds(10);

struct RendezvousProgress {
  absl::Duration every = absl::Seconds(5);
  std::function<void(const std::string& line)> say;  // null: "gradwire: <line>" on stderr
  absl::Duration join_store_wait = kJoinStoreWait;   // shorter in tests
};

class Rendezvous {
 public:
  static constexpr absl::Duration kJoinStoreWait = internal::kJoinStoreWait;

  static absl::StatusOr<std::unique_ptr<Rendezvous>> Join(const AgentOptions& options, absl::Time deadline,
                                                          RendezvousProgress progress = {});
  ~Rendezvous();

  const std::string& store_address() const { return store_address_; }
  bool hosts_store() const { return server_ != nullptr; }
  bool keys_outlive_job() const { return etcd_ != nullptr; }
  Store& store() { return *store_; }
  std::string Key(absl::string_view what, int rank) const;

  absl::Status Announce(const WorkerInfo& self);
  absl::StatusOr<std::vector<WorkerInfo>> AwaitAll(absl::Time deadline);
  absl::StatusOr<WorkerInfo> Lookup(int rank, absl::Duration timeout);

  absl::Status PublishGroup(int world_size, int capacity);
  absl::StatusOr<std::pair<int, int>> ReadGroup(absl::Time deadline);  // world_size, capacity
  absl::StatusOr<int> ClaimRank(int world_size, int capacity);
  absl::StatusOr<int> Ranks(int world_size, int capacity);
  absl::Status MarkLeft(int rank);
  bool HasLeft(int rank);
  struct Found {
    std::vector<WorkerInfo> workers;  // by rank
    std::vector<int> left;
  };
  absl::StatusOr<Found> FindMembers(int world_size, int capacity, int self, absl::Time deadline);
  absl::Status ForgetRun();
  void Close();

 private:
  Rendezvous(const AgentOptions& options, RendezvousProgress progress)
      : options_(options), progress_(std::move(progress)) {}
  absl::StatusOr<WorkerInfo> Parse(int rank, const std::string& record) const;
  absl::Status Connect(absl::Time deadline);
  std::string Who() const;
  void Say(const std::string& line) const;
  std::string Waited(absl::Time since, absl::Time deadline) const;

  const AgentOptions options_;
  const RendezvousProgress progress_;
  std::string store_address_;
  std::unique_ptr<StoreServer> server_;
  // Shared, so that a Lookup racing Close (a call to a dead peer while the agent shuts
  // down) holds the store it reads; Close drops it under `mu_`.
  std::shared_ptr<Store> Current() const;
  mutable absl::Mutex mu_;
  std::shared_ptr<Store> store_;
  EtcdStore* etcd_ = nullptr;  // store_, when it is etcd
};

absl::StatusOr<std::string> RendezvousHost(const std::string& address);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CLUSTER_RENDEZVOUS_H_
