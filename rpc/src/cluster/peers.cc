#include "cluster/peers.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/global_id.h"

namespace gw::rpc::internal {
namespace {

// How long one dial of a peer may take: every worker listened before the group started,
// so a refused connection means the peer is gone or restarting.
constexpr absl::Duration kDialTimeout = absl::Seconds(2);

}  // namespace

void Peers::SetWorkers(std::vector<WorkerInfo> workers) {
  workers_ = std::move(workers);
  members_.SetKnown(workers_);
}

std::string Peers::Describe(int rank) const {
  if (members_.state(rank) != Members::State::kAbsent) return absl::StrCat(Name(rank), " (rank ", rank, ")");
  return Name(rank);
}

absl::StatusOr<Message> Peers::EncodeHello(const absl::Status& refusal) const {
  Envelope hello;
  hello.kind = Kind::kHello;
  hello.payload =
      ValueTraits<HelloMessage>::To(HelloMessage{self_.rank, self_.name, kProtocolVersion, self_.address, self_.pid});
  hello.status = refusal;
  return EncodeEnvelope(hello);
}

absl::StatusOr<std::shared_ptr<Connection>> Peers::Outgoing(int rank) {
  if (rank < 0 || rank >= members_.capacity()) {
    return absl::NotFoundError(absl::StrCat("no worker of rank ", rank, " in this group"));
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    if (outgoing_[rank] && !outgoing_[rank]->closed()) return outgoing_[rank];
  }
  std::optional<WorkerInfo> record = members_.Get(rank);  // dialling: its address
  if (!record) return absl::NotFoundError(absl::StrCat("no worker of rank ", rank, " in this group"));
  absl::MutexLock dial(&dial_mu_[rank]);
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    if (outgoing_[rank] && !outgoing_[rank]->closed()) return outgoing_[rank];
    // The peer dialled us: call it on that connection too (one connection per pair).
    for (const auto& [raw, id] : rank_of_) {
      if (id.rank != rank) continue;
      if (std::shared_ptr<Connection> in = id.conn.lock(); in && !in->closed()) {
        outgoing_[rank] = in;
        return in;
      }
    }
    auto moved = dial_address_.find(rank);
    address = moved != dial_address_.end() ? moved->second : record->address;
  }
  auto conn = transport_.Connect(address, callbacks_, absl::Now() + kDialTimeout);
  if (!conn.ok()) {
    // A restarted worker announces its rank again with a new address: look it up.
    if (absl::StatusOr<WorkerInfo> now = rendezvous_.Lookup(rank, absl::Seconds(1));
        now.ok() && now->address != address) {
      {
        absl::MutexLock lock(&mu_);
        dial_address_[rank] = now->address;
      }
      conn = transport_.Connect(now->address, callbacks_, absl::Now() + kDialTimeout);
    }
  }
  if (!conn.ok()) return UnavailableError(Describe(rank), conn.status().message());
  absl::StatusOr<Message> hello = EncodeHello(absl::OkStatus());
  if (!hello.ok()) return hello.status();
  if (events_.connected) events_.connected(rank);  // before it is identified (see OnHello)
  {
    absl::MutexLock lock(&mu_);
    outgoing_[rank] = *conn;
    rank_of_[conn->get()] = {rank, *conn};
  }
  (*conn)->Send(std::move(*hello));  // before any request: the connection keeps the order
  return *conn;
}

absl::Status Peers::Check(const Envelope& env, HelloMessage* peer, bool* joined) {
  if (env.payload.is<int64_t>()) {
    // Releases before typed messages sent their rank alone.
    return absl::FailedPreconditionError(absl::StrCat(
        "it speaks gradwire protocol 1, ", self_.name, " speaks ", kProtocolVersion, " (accepts ", kMinProtocolVersion,
        " to ", kProtocolVersion, "): run the same gradwire version on every worker"));
  }
  absl::StatusOr<HelloMessage> hello = ValueTraits<HelloMessage>::From(env.payload);
  if (!hello.ok()) return absl::FailedPreconditionError(absl::StrCat("malformed hello: ", hello.status().message()));
  if (hello->protocol_version < kMinProtocolVersion || hello->protocol_version > kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(hello->name, " speaks gradwire protocol ", hello->protocol_version, ", ", self_.name, " speaks ",
                     kProtocolVersion, " (accepts ", kMinProtocolVersion, " to ", kProtocolVersion,
                     "): run the same gradwire version on every worker"));
  }
  WorkerInfo w{hello->name, static_cast<int>(std::clamp<int64_t>(hello->rank, -1, GlobalId::kMaxRanks)), hello->address,
               hello->pid};
  if (absl::Status s = members_.Admit(w, joined); !s.ok()) return s;
  *peer = *std::move(hello);
  return absl::OkStatus();
}

absl::Status Peers::OnHello(const std::shared_ptr<Connection>& conn, const Envelope& env) {
  bool outgoing = false;
  int dialled = -1;
  {
    absl::MutexLock lock(&mu_);
    auto it = rank_of_.find(conn.get());
    if (it != rank_of_.end()) {
      dialled = it->second.rank;
      outgoing = outgoing_[static_cast<size_t>(dialled)] == conn;
    }
  }
  if (outgoing) {
    // The acceptor's answer to our hello: its refusal, or its own hello to check.
    absl::Status s = env.status;
    HelloMessage peer;
    bool joined = false;
    if (s.ok()) s = Check(env, &peer, &joined);
    if (s.ok() && peer.rank != dialled) {
      s = absl::FailedPreconditionError(absl::StrCat("dialled ", Describe(dialled), " but ", peer.name, " answered"));
    }
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat(Name(dialled), " and ", self_.name, " cannot talk: ", s.message()));
      conn->Close(s);
    }
    return s;
  }
  HelloMessage peer;
  bool joined = false;
  absl::Status s = Check(env, &peer, &joined);
  if (!s.ok()) {
    s = absl::Status(s.code(),
                     absl::StrCat(self_.name, " refused a connection from ", conn->peer(), ": ", s.message()));
    std::fprintf(stderr, "gradwire: %s\n", std::string(s.message()).c_str());
    absl::StatusOr<Message> refusal = EncodeHello(s);
    if (refusal.ok()) {
      conn->Send(std::move(*refusal), [conn, s](absl::Status) { conn->Close(s); });
    } else {
      conn->Close(s);
    }
    return s;
  }
  // Our hello goes first: once the connection is identified, Outgoing may send calls on it.
  absl::StatusOr<Message> answer = EncodeHello(absl::OkStatus());
  if (answer.ok()) conn->Send(std::move(*answer));
  // Heard before the connection is identified: a detector's tick that sees the connection
  // sees the news too.
  if (events_.connected) events_.connected(static_cast<int>(peer.rank));
  {
    absl::MutexLock lock(&mu_);
    rank_of_[conn.get()] = {static_cast<int>(peer.rank), conn};
  }
  if (joined && events_.joined) events_.joined(*members_.Get(static_cast<int>(peer.rank)));
  return absl::OkStatus();
}

int Peers::RankOf(const Connection* conn) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = rank_of_.find(conn);
  return it == rank_of_.end() ? -1 : it->second.rank;
}

std::pair<int, bool> Peers::Forget(const std::shared_ptr<Connection>& conn) {
  absl::MutexLock lock(&mu_);
  int rank = -1;
  auto it = rank_of_.find(conn.get());
  if (it != rank_of_.end()) {
    rank = it->second.rank;
    rank_of_.erase(it);
  }
  bool outgoing = false;
  if (rank >= 0 && rank < static_cast<int>(outgoing_.size()) && outgoing_[static_cast<size_t>(rank)] == conn) {
    outgoing_[static_cast<size_t>(rank)].reset();
    outgoing = true;
  }
  return {rank, outgoing};
}

std::vector<std::pair<int, std::shared_ptr<Connection>>> Peers::Connected() const {
  std::vector<std::pair<int, std::shared_ptr<Connection>>> out;
  absl::ReaderMutexLock lock(&mu_);
  std::vector<bool> listed(outgoing_.size(), false);
  for (size_t rank = 0; rank < outgoing_.size(); ++rank) {
    if (outgoing_[rank] && !outgoing_[rank]->closed()) {
      out.emplace_back(static_cast<int>(rank), outgoing_[rank]);
      listed[rank] = true;
    }
  }
  for (const auto& [raw, id] : rank_of_) {
    if (id.rank < 0 || static_cast<size_t>(id.rank) >= listed.size() || listed[static_cast<size_t>(id.rank)]) continue;
    std::shared_ptr<Connection> conn = id.conn.lock();
    if (!conn || conn->closed()) continue;
    out.emplace_back(id.rank, std::move(conn));
    listed[static_cast<size_t>(id.rank)] = true;
  }
  return out;
}

void Peers::CloseRank(int rank, const absl::Status& reason) {
  std::vector<std::shared_ptr<Connection>> conns;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [raw, id] : rank_of_) {
      if (id.rank != rank) continue;
      if (std::shared_ptr<Connection> conn = id.conn.lock()) conns.push_back(std::move(conn));
    }
  }
  for (const auto& conn : conns) conn->Close(reason);  // outside the lock: on_close may run here
}

void Peers::CloseAll() {
  absl::MutexLock lock(&mu_);
  for (auto& c : outgoing_) c.reset();
}

}  // namespace gw::rpc::internal
