// Internal: Rendezvous, how an agent finds the other workers of its group.
//
// Contract
//   - Join connects to the rendezvous store at options.rendezvous (rank 0 first starts
//     it there when options.host_store; port 0 picks a free one, see store_address()).
//     An options.rendezvous "etcd://HOST:PORT/JOB" is an etcd cluster (etcd_store.h):
//     nobody hosts it (host_store is ignored) and JOB is the namespace of every key.
//   - Announce(self) publishes this worker's record (name, transport address, pid) under
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
//     is how many ranks were handed out so far (claims refused as over capacity not counted). MarkLeft(rank) records that a worker left
//     (HasLeft reads it); FindMembers(world_size, capacity, self, deadline) is what a joiner knows
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
//   - Close() drops the store client and stops the store it hosts. Thread-safe.
#ifndef GRADWIRE_RPC_SRC_RENDEZVOUS_H_
#define GRADWIRE_RPC_SRC_RENDEZVOUS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "etcd_store.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/store.h"

namespace gw::rpc::internal {

class Rendezvous {
 public:
  static absl::StatusOr<std::unique_ptr<Rendezvous>> Join(const AgentOptions& options, absl::Time deadline);
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
  Rendezvous(const AgentOptions& options) : options_(options) {}
  absl::StatusOr<WorkerInfo> Parse(int rank, const std::string& record) const;

  const AgentOptions options_;
  std::string store_address_;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<Store> store_;
  EtcdStore* etcd_ = nullptr;  // store_, when it is etcd
};

absl::StatusOr<std::string> RendezvousHost(const std::string& address);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_RENDEZVOUS_H_
