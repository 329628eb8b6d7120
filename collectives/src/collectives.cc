#include "gradwire/collectives/collectives.h"

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "group_state.h"
#include "messages.h"

namespace gw::collectives {
namespace {

// FNV-1a: the same on every member (absl::Hash is seeded per process).
uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

class Collectives::Impl : public std::enable_shared_from_this<Collectives::Impl> {
 public:
  explicit Impl(rpc::Agent& agent) : agent_(agent) {}

  absl::Status Install() {
    std::weak_ptr<Impl> weak = weak_from_this();
    rpc::RegisterOptions inline_mode{rpc::HandlerMode::kInline};
    absl::Status s = agent_.Handle<internal::CollectiveChunk>(
        [weak, agent = &agent_](const rpc::CallInfo& info, internal::CollectiveChunk chunk) -> Future<rpc::Ack> {
          std::shared_ptr<Impl> self = weak.lock();
          if (!self) {
            return MakeReadyFuture<rpc::Ack>(
                agent->executor(), rpc::UnavailableError(agent->self().name, "it has no process groups any more"));
          }
          return self->Deliver(info, std::move(chunk));
        },
        inline_mode);
    if (!s.ok()) return s;
    s = agent_.Handle<internal::CollectiveAbort>(
        [weak](const rpc::CallInfo& info, internal::CollectiveAbort abort) -> absl::Status {
          if (std::shared_ptr<Impl> self = weak.lock()) self->OnAbort(info, abort);
          return absl::OkStatus();
        },
        inline_mode);
    if (!s.ok()) return s;
    watch_ = agent_.WatchPeers([weak](int rank) {
      if (std::shared_ptr<Impl> self = weak.lock()) self->OnPeerGone(rank);
    });
    return absl::OkStatus();
  }

  size_t early() const {
    absl::MutexLock lock(&mu_);
    return early_count_;
  }
  bool AwaitEarly(size_t n, absl::Time deadline) const {
    struct At {
      const Impl* self;
      size_t n;
    } at{this, n};
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(absl::Condition(
                                     +[](At* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->self->early_count_ >= a->n; }, &at),
                                 deadline);
  }

  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewGroup(std::vector<int> ranks, GroupOptions options) {
    const int world = static_cast<int>(agent_.workers().size());
    if (ranks.empty()) {
      for (int r = 0; r < world; ++r) ranks.push_back(r);
    }
    std::sort(ranks.begin(), ranks.end());
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= world) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", ranks[i], " is not a worker of this job (", world, " workers)"));
      }
      if (i > 0 && ranks[i] == ranks[i - 1]) return absl::InvalidArgumentError(absl::StrCat("rank ", ranks[i], " is listed twice"));
    }
    const int self = agent_.self().rank;
    auto it = std::lower_bound(ranks.begin(), ranks.end(), self);
    if (it == ranks.end() || *it != self) {
      return absl::InvalidArgumentError(absl::StrCat(agent_.self().name, " (rank ", self, ") is not one of the group's ranks"));
    }
    GroupState::Config config;
    config.agent = &agent_;
    config.rank = static_cast<int>(it - ranks.begin());
    config.timeout = options.timeout > absl::ZeroDuration() ? options.timeout : agent_.options().default_timeout;
    // At least 4 KiB per piece: a message per piece costs far more than moving 4 KiB.
    options.piece_bytes = std::max(options.piece_bytes, size_t{4} << 10);
    std::vector<std::pair<int, internal::CollectiveChunk>> early;
    std::vector<std::pair<int, internal::CollectiveAbort>> early_aborts;
    std::shared_ptr<GroupState> state;
    {
      absl::MutexLock lock(&mu_);
      // Members that make groups over the same ranks and name in the same order agree on ids.
      std::string key = absl::StrCat(options.name, "/", absl::StrJoin(ranks, ","));
      const int64_t occurrence = made_[key]++;
      uint64_t h = Fnv(1469598103934665603ull, key.data(), key.size());
      h = Fnv(h, &occurrence, sizeof(occurrence));
      config.id = static_cast<int64_t>(h >> 1);
      config.ranks = ranks;
      config.options = options;
      config.owner = shared_from_this();  // the layer's handlers route to the group while it lives
      state = std::make_shared<GroupState>(std::move(config));
      groups_[state->id()] = state;
      if (auto e = early_.find(state->id()); e != early_.end()) {
        early = std::move(e->second.chunks);
        early_aborts = std::move(e->second.aborts);
        early_count_ -= early.size() + early_aborts.size();
        early_.erase(e);
      }
    }
    state->Start();
    // Parked pieces were answered already: what Deliver answers now has no one to go to.
    for (auto& [from, chunk] : early) (void)state->Deliver(from, std::move(chunk));
    for (auto& [from, abort] : early_aborts) state->Abort(from, abort);
    return std::make_shared<ProcessGroup>(state);
  }

 private:
  struct Early {
    std::vector<std::pair<int, internal::CollectiveChunk>> chunks;  // (sender's rank, piece)
    std::vector<std::pair<int, internal::CollectiveAbort>> aborts;
  };

  std::shared_ptr<GroupState> Find(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = groups_.find(id);
    if (it == groups_.end()) return nullptr;
    std::shared_ptr<GroupState> g = it->second.lock();
    if (!g) {
      groups_.erase(it);
      Retire(id);
    }
    return g;
  }

  // A group that was made here and is gone: messages for it are not parked (as for a group
  // not made yet, which they would never reach) but dropped or refused. Ids never repeat
  // (a group's id counts the groups made before it over the same ranks and name), so the
  // last kRetiredGroups are enough to tell the members' last words apart.
  void Retire(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!retired_.insert(id).second) return;
    retired_order_.push_back(id);
    if (retired_order_.size() > kRetiredGroups) {
      retired_.erase(retired_order_.front());
      retired_order_.pop_front();
    }
  }

  Future<rpc::Ack> Deliver(const rpc::CallInfo& info, internal::CollectiveChunk chunk) {
    std::shared_ptr<GroupState> group;
    {
      absl::MutexLock lock(&mu_);
      group = Find(chunk.group);
      if (!group && retired_.contains(chunk.group)) {
        return MakeReadyFuture<rpc::Ack>(
            agent_.executor(), rpc::UnavailableError(agent_.self().name, "it closed the group (it no longer exists there)"));
      }
      if (!group) {
        if (early_count_ >= kMaxEarlyMessages) {
          return MakeReadyFuture<rpc::Ack>(
              agent_.executor(),
              absl::ResourceExhaustedError(absl::StrCat(agent_.self().name, " holds ", early_count_,
                                                        " collective pieces for groups it has not made (yet)")));
        }
        Park(info.caller_rank, std::move(chunk));
        return MakeReadyFuture<rpc::Ack>(agent_.executor(), rpc::Ack{});
      }
    }
    return group->Deliver(info.caller_rank, std::move(chunk));
  }

  // A piece for a group this worker has not made yet waits for it (answered now: the
  // flow control of the group's inbox starts once the group exists).
  void Park(int from, internal::CollectiveChunk chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t id = chunk.group;
    early_[id].chunks.emplace_back(from, std::move(chunk));
    ++early_count_;
  }

  void OnAbort(const rpc::CallInfo& info, const internal::CollectiveAbort& abort) {
    std::shared_ptr<GroupState> group;
    {
      absl::MutexLock lock(&mu_);
      group = Find(abort.group);
      if (!group && retired_.contains(abort.group)) return;  // e.g. a member's close, after ours
      if (!group) {
        if (early_count_ < kMaxEarlyMessages) {
          early_[abort.group].aborts.emplace_back(info.caller_rank, abort);
          ++early_count_;
        }
        return;
      }
    }
    group->Abort(info.caller_rank, abort);
  }

  void OnPeerGone(int rank) {
    std::vector<std::shared_ptr<GroupState>> groups;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [id, weak] : groups_) {
        if (std::shared_ptr<GroupState> g = weak.lock()) groups.push_back(std::move(g));
      }
    }
    for (const auto& g : groups) g->OnPeerGone(rank);
  }

  rpc::Agent& agent_;
  rpc::Agent::PeerWatch watch_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int64_t, std::weak_ptr<GroupState>> groups_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> made_ ABSL_GUARDED_BY(mu_);  // groups made per ranks + name
  absl::flat_hash_map<int64_t, Early> early_ ABSL_GUARDED_BY(mu_);
  size_t early_count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<int64_t> retired_ ABSL_GUARDED_BY(mu_);
  std::deque<int64_t> retired_order_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::shared_ptr<Collectives>> Collectives::Install(rpc::Agent& agent) {
  auto impl = std::make_shared<Impl>(agent);
  if (absl::Status s = impl->Install(); !s.ok()) {
    if (s.code() == absl::StatusCode::kAlreadyExists) {
      return absl::AlreadyExistsError(absl::StrCat("collectives are already installed on ", agent.self().name));
    }
    return s;
  }
  return std::shared_ptr<Collectives>(new Collectives(std::move(impl)));
}

Collectives::Collectives(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Collectives::~Collectives() = default;

absl::StatusOr<std::shared_ptr<ProcessGroup>> Collectives::NewGroup(std::vector<int> ranks, GroupOptions options) {
  return impl_->NewGroup(std::move(ranks), std::move(options));
}
size_t Collectives::early() const { return impl_->early(); }
bool Collectives::AwaitEarly(size_t n, absl::Time deadline) const { return impl_->AwaitEarly(n, deadline); }

}  // namespace gw::collectives
