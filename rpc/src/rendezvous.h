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
