#include "cluster/membership.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gradwire/rpc/errors.h"

namespace gw::rpc::internal {

absl::Status Membership::ClaimRank(Rendezvous& rendezvous, AgentOptions& options, absl::Time deadline) {
  absl::StatusOr<std::pair<int, int>> group = rendezvous.ReadGroup(deadline);
  if (!group.ok()) return group.status();
  options.world_size = group->first;
  options.max_world_size = group->second;
  absl::StatusOr<int> rank = rendezvous.ClaimRank(group->first, group->second);
  if (!rank.ok()) return rank.status();
  options.rank = *rank;
  return absl::OkStatus();
}

absl::Status Membership::Form(const WorkerInfo& self, absl::Time deadline) {
  return options_.join ? FindMembers(self, deadline) : AwaitGroup(deadline);
}

// Start's group: every rank announces itself; rank 0 then says the group is formed (a
// worker that joins later waits for that).
absl::Status Membership::AwaitGroup(absl::Time deadline) {
  absl::StatusOr<std::vector<WorkerInfo>> workers = rendezvous_.AwaitAll(deadline);
  if (!workers.ok()) return workers.status();
  peers_.SetWorkers(*std::move(workers));
  UpdateNames();
  if (options_.rank == 0) return rendezvous_.PublishGroup(options_.world_size, options_.max_world_size);
  return absl::OkStatus();
}

// A worker that joins: every member the store knows of.
absl::Status Membership::FindMembers(const WorkerInfo& self, absl::Time deadline) {
  absl::StatusOr<Rendezvous::Found> found =
      rendezvous_.FindMembers(options_.world_size, options_.max_world_size, options_.rank, deadline);
  if (!found.ok()) return found.status();
  std::vector<WorkerInfo> group(static_cast<size_t>(options_.world_size));
  std::vector<WorkerInfo> joined{self};
  for (WorkerInfo& w : found->workers) {
    if (w.rank < options_.world_size) {
      group[static_cast<size_t>(w.rank)] = w;
    } else {
      joined.push_back(w);
    }
  }
  members_.SetKnown(joined);
  peers_.SetWorkers(std::move(group));
  for (int rank : found->left) members_.MarkLeft(rank);
  UpdateNames();
  return absl::OkStatus();
}

void Membership::Introduce(absl::Time deadline) { TellAll(JoinNotice::kFunction, deadline, "joined without"); }

void Membership::TellLeaving(absl::Time deadline) { TellAll(LeaveNotice::kFunction, deadline, nullptr); }

void Membership::TellAll(const std::string& function, absl::Time deadline, const char* failed) {
  std::vector<std::pair<std::string, Future<Ack>>> told;
  for (const WorkerInfo& w : members_.Present()) {
    if (w.rank != options_.rank) told.emplace_back(w.name, hooks_.notify(w.name, function, deadline));
  }
  for (auto& [name, f] : told) {
    absl::StatusOr<Ack> r = f.Get(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!r.ok() && failed != nullptr) {
      std::fprintf(stderr, "gradwire: %s %s %s: %s\n", options_.name.c_str(), failed, name.c_str(),
                   std::string(r.status().message()).c_str());
    }
  }
}

void Membership::UpdateNames() {
  absl::MutexLock lock(&names_mu_);
  std::vector<std::string> names;
  for (int r = 0; r < members_.capacity(); ++r) names.push_back(members_.Name(r));
  hooks_.names(std::move(names));
}

void Membership::OnJoined(const WorkerInfo& w) {
  UpdateNames();
  watchers_->Notify(MemberChange{MemberChange::Kind::kJoined, w});
}

void Membership::OnLeaveNotice(int rank) {
  if (!members_.MarkLeft(rank)) return;
  if (!hooks_.left(rank)) return;
  watchers_->Notify(MemberChange{MemberChange::Kind::kLeft, *members_.Get(rank)});
}

absl::Status Membership::GoneError(int rank) const {
  if (members_.state(rank) == Members::State::kLeft) return UnavailableError(NameOf(rank), "it left the job");
  return DeclaredDeadError(NameOf(rank));
}

}  // namespace gw::rpc::internal
