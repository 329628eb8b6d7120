#include "rendezvous.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "host_address.h"

namespace gw::rpc::internal {

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Join(const AgentOptions& options, absl::Time deadline) {
  std::unique_ptr<Rendezvous> r(new Rendezvous(options));
  r->store_address_ = options.rendezvous;
  if (IsEtcdUrl(options.rendezvous)) {
    absl::StatusOr<std::unique_ptr<EtcdStore>> etcd =
        ConnectEtcdStore(options.rendezvous, deadline, options.security.tls);
    if (!etcd.ok()) return etcd.status();
    r->etcd_ = etcd->get();
    r->store_ = *std::move(etcd);
    return r;
  }
  if (options.rank == 0 && options.host_store) {
    const size_t colon = options.rendezvous.rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(options.rendezvous.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(absl::StrCat("bad rendezvous address '", options.rendezvous,
                                                     "' (expected host:port, e.g. MASTER_ADDR:MASTER_PORT)"));
    }
    auto server = StoreServer::Start(options.rendezvous.substr(0, colon), port, options.security);
    if (!server.ok()) return server.status();
    r->server_ = std::move(*server);
    if (port == 0) r->store_address_ = r->server_->address();
  }
  auto store = ConnectStore(r->store_address_, deadline, options.security);
  if (!store.ok()) return store.status();
  r->store_ = std::move(*store);
  return r;
}

Rendezvous::~Rendezvous() { Close(); }

std::string Rendezvous::Key(absl::string_view what, int rank) const {
  return absl::StrCat(options_.run_id, "/", what, rank);
}

absl::Status Rendezvous::Announce(const WorkerInfo& self) {
  return store_->Set(Key("worker/", self.rank), absl::StrCat(self.name, "\n", self.address, "\n", self.pid));
}

absl::StatusOr<WorkerInfo> Rendezvous::Parse(int rank, const std::string& record) const {
  std::vector<std::string> parts = absl::StrSplit(record, '\n');
  WorkerInfo w;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[2], &w.pid)) {
    return absl::DataLossError(absl::StrCat("bad worker record for rank ", rank, " in the rendezvous store"));
  }
  w.name = parts[0];
  w.rank = rank;
  w.address = parts[1];
  return w;
}

absl::StatusOr<std::vector<WorkerInfo>> Rendezvous::AwaitAll(absl::Time deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < options_.world_size; ++r) keys.push_back(Key("worker/", r));
  if (absl::Status s = store_->Wait(keys, deadline - absl::Now()); !s.ok()) {
    std::vector<std::string> missing;
    for (int r = 0; r < options_.world_size; ++r) {
      if (!store_->Get(keys[static_cast<size_t>(r)], absl::Milliseconds(1)).ok()) missing.push_back(absl::StrCat(r));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "not every worker joined within ", absl::FormatDuration(options_.start_timeout), ": rank(s) ",
        missing.empty() ? "?" : absl::StrJoin(missing, ", "), " of ", options_.world_size,
        " did not announce themselves (", s.message(), "); check WORLD_SIZE and that every rank was started"));
  }
  std::vector<WorkerInfo> workers;
  absl::flat_hash_map<std::string, int> by_name;
  for (int r = 0; r < options_.world_size; ++r) {
    auto record = store_->Get(keys[static_cast<size_t>(r)], deadline - absl::Now());
    if (!record.ok()) return record.status();
    absl::StatusOr<WorkerInfo> w = Parse(r, *record);
    if (!w.ok()) return w.status();
    if (auto [it, fresh] = by_name.emplace(w->name, r); !fresh) {
      return absl::InvalidArgumentError(absl::StrCat("worker name '", w->name, "' is used by ranks ", it->second,
                                                     " and ", r, "; names must be unique"));
    }
    workers.push_back(*std::move(w));
  }
  return workers;
}

absl::StatusOr<WorkerInfo> Rendezvous::Lookup(int rank, absl::Duration timeout) {
  auto record = store_->Get(Key("worker/", rank), timeout);
  if (!record.ok()) return record.status();
  return Parse(rank, *record);
}

absl::Status Rendezvous::PublishGroup(int world_size, int capacity) {
  return store_->Set(absl::StrCat(options_.run_id, "/group"), absl::StrCat(world_size, " ", capacity));
}

absl::StatusOr<std::pair<int, int>> Rendezvous::ReadGroup(absl::Time deadline) {
  const std::string key = absl::StrCat(options_.run_id, "/group");
  absl::StatusOr<std::string> v = store_->Get(key, deadline - absl::Now());
  if (!v.ok()) {
    return absl::Status(v.status().code(),
                        absl::StrCat("no running group '", options_.run_id, "' to join at ", store_address_, ": ",
                                     v.status().message(), " (its rank 0 publishes it once the group has formed)"));
  }
  std::pair<int, int> group;
  std::vector<std::string> parts = absl::StrSplit(*v, ' ');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &group.first) || !absl::SimpleAtoi(parts[1], &group.second)) {
    return absl::DataLossError(absl::StrCat("bad group record '", *v, "' in the rendezvous store"));
  }
  return group;
}

absl::StatusOr<int> Rendezvous::ClaimRank(int world_size, int capacity) {
  absl::StatusOr<int64_t> n = store_->Add(absl::StrCat(options_.run_id, "/joined"), 1);
  if (!n.ok()) return n.status();
  const int64_t rank = world_size + *n - 1;
  if (rank >= capacity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job '", options_.run_id, "' is full: its ", world_size, " workers and those that joined since use all ",
        capacity, " ranks it may grow to (start it with a larger max_world_size: GRADWIRE_MAX_WORLD_SIZE, "
        "gradwire launch --max-workers)"));
  }
  return static_cast<int>(rank);
}

absl::StatusOr<int> Rendezvous::Ranks(int world_size, int capacity) {
  absl::StatusOr<int64_t> n = store_->Add(absl::StrCat(options_.run_id, "/joined"), 0);
  if (!n.ok()) return n.status();
  return static_cast<int>(std::min<int64_t>(world_size + *n, capacity));
}

absl::Status Rendezvous::MarkLeft(int rank) { return store_->Set(Key("left/", rank), "1"); }

bool Rendezvous::HasLeft(int rank) { return store_->Get(Key("left/", rank), absl::Milliseconds(1)).ok(); }

absl::StatusOr<Rendezvous::Found> Rendezvous::FindMembers(int world_size, int capacity, int self, absl::Time deadline) {
  absl::StatusOr<int> ranks = Ranks(world_size, capacity);
  if (!ranks.ok()) return ranks.status();
  Found found;
  for (int r = 0; r < *ranks; ++r) {
    if (r == self) continue;
    // Start's group is complete (it published the group); a joiner may not have
    // announced itself yet (or never will: it died first).
    absl::StatusOr<WorkerInfo> w = Lookup(r, r < world_size ? deadline - absl::Now() : absl::Milliseconds(200));
    if (!w.ok()) {
      if (r < world_size) return w.status();
      continue;
    }
    if (HasLeft(r)) found.left.push_back(r);
    found.workers.push_back(*std::move(w));
  }
  return found;
}

absl::Status Rendezvous::ForgetRun() {
  if (etcd_ == nullptr) return absl::OkStatus();
  return etcd_->DeletePrefix(absl::StrCat(options_.run_id, "/")).status();
}

void Rendezvous::Close() {
  etcd_ = nullptr;
  store_.reset();
  if (server_) server_->Shutdown();
}

absl::StatusOr<std::string> RendezvousHost(const std::string& address) {
  if (IsEtcdUrl(address)) {
    absl::StatusOr<EtcdUrl> url = ParseEtcdUrl(address);
    if (!url.ok()) return url.status();
    return url->host;
  }
  absl::StatusOr<HostPort> hp = SplitHostPort(address);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bad rendezvous address '", address,
                                                   "' (expected host:port or etcd://HOST:PORT/JOB)"));
  }
  return hp->host;
}

}  // namespace gw::rpc::internal
