#include "store/store_sessions.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gw::rpc::internal {
namespace {

constexpr size_t kMaxPending = 1024;
constexpr int kMaxPendingPerClient = 256;  // a host may run a whole job's workers
constexpr size_t kMaxSessions = 16384;
constexpr uint64_t kSeqWindow = 4096;

}  // namespace

std::string CallMac(absl::string_view key, absl::string_view method, uint64_t seq, absl::string_view body) {
  return absl::BytesToHexString(Handshake::Mac(key, absl::StrCat(method, "|", seq, "|", body)));
}

StoreSessions::StoreSessions(std::string secret, absl::Duration handshake_timeout)
    : secret_(std::move(secret)), timeout_(handshake_timeout) {}

uint64_t StoreSessions::NewId() {
  while (true) {
    uint64_t id = 0;
    const std::string bytes = Handshake::RandomBytes(sizeof(id));
    std::memcpy(&id, bytes.data(), sizeof(id));
    if (id != 0 && !pending_.contains(id) && !sessions_.contains(id)) return id;
  }
}

absl::StatusOr<StoreSessions::Challenge> StoreSessions::Hello(const std::string& from, absl::string_view hello) {
  auto hs = std::make_unique<Handshake>(Handshake::Role::kServer, secret_, std::string(kStorePurpose));
  if (hello.size() != hs->wanted()) return absl::UnauthenticatedError("the hello is not a gradwire handshake");
  if (absl::Status s = hs->OnInput(hello); !s.ok()) return s;
  Challenge c{hs->TakeOutput(), 0};
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  std::erase_if(pending_, [now](const auto& p) { return p.second.expires < now; });
  int mine = 0;
  for (const auto& [_, p] : pending_) mine += p.from == from ? 1 : 0;
  if (mine >= kMaxPendingPerClient) {
    return absl::ResourceExhaustedError(
        absl::StrCat(mine, " handshakes of this client are already pending: finish them first"));
  }
  if (pending_.size() >= kMaxPending) {
    pending_.erase(std::min_element(pending_.begin(), pending_.end(),
                                    [](const auto& a, const auto& b) { return a.second.expires < b.second.expires; }));
  }
  c.handshake = NewId();
  pending_.emplace(c.handshake, Pending{std::move(hs), now + timeout_, from});
  return c;
}

StoreSessions::Verdict StoreSessions::Prove(uint64_t handshake, absl::string_view proof) {
  std::unique_ptr<Handshake> hs;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(handshake);
    if (it == pending_.end() || it->second.expires < absl::Now()) {
      if (it != pending_.end()) pending_.erase(it);
      return {"", 0, absl::UnauthenticatedError("no such handshake (expired, already used, or never begun)")};
    }
    hs = std::move(it->second.handshake);
    pending_.erase(it);  // one proof per challenge: a replayed proof finds nothing
  }
  if (proof.size() != hs->wanted()) return {"", 0, absl::UnauthenticatedError("the proof is not a gradwire handshake")};
  const absl::Status s = hs->OnInput(proof);
  Verdict v{hs->TakeOutput(), 0, s};
  if (!s.ok()) return v;
  absl::MutexLock lock(&mu_);
  if (sessions_.size() >= kMaxSessions) sessions_.erase(sessions_.begin());
  v.session = NewId();
  sessions_[v.session].key = hs->session_key();
  return v;
}

absl::Status StoreSessions::Authorize(absl::string_view session, absl::string_view seq, absl::string_view mac,
                                      absl::string_view method, absl::string_view body) {
  uint64_t id = 0, n = 0;
  if (session.empty()) {
    return absl::UnauthenticatedError(
        "the store authenticates its clients and this call carries no session: the client runs without the "
        "job's secret (set GRADWIRE_SECRET_FILE or GRADWIRE_SECRET as the job's workers have it)");
  }
  if (!absl::SimpleAtoi(session, &id) || !absl::SimpleAtoi(seq, &n) || n == 0) {
    return absl::UnauthenticatedError("malformed session metadata");
  }
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::UnauthenticatedError("unknown session (dropped to make room for others: open a new one)");
  }
  Session& s = it->second;
  if (!Handshake::SameMac(mac, CallMac(s.key, method, n, body))) {
    return absl::UnauthenticatedError("the call's MAC is wrong (altered, or signed with another key)");
  }
  if ((s.max_seq >= kSeqWindow && n <= s.max_seq - kSeqWindow) || s.recent.contains(n)) {
    return absl::UnauthenticatedError("the call was replayed (its sequence number was seen before)");
  }
  s.recent.insert(n);
  if (n > s.max_seq) {
    s.max_seq = n;
    if (s.recent.size() > 2 * kSeqWindow) {
      for (auto r = s.recent.begin(); r != s.recent.end();) {
        if (*r + kSeqWindow <= s.max_seq) {
          s.recent.erase(r++);
        } else {
          ++r;
        }
      }
    }
  }
  return absl::OkStatus();
}

CallSigner::Signature CallSigner::Sign(absl::string_view method, absl::string_view body) {
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    seq = next_seq_++;
  }
  return {absl::StrCat(session_), absl::StrCat(seq), CallMac(key_, method, seq, body)};
}

}  // namespace gw::rpc::internal
