// Internal: Membership, the protocol by which an agent's group forms and changes
// (elastic groups, agent.h): Start's group, a worker that joins a running group, a member
// that leaves, and the functions that watch them (Agent::WatchMembers).
//
// Contract
//   - ClaimRank (before the agent's units exist, since they need the rank): a worker that
//     joins reads the group's size and capacity from the store (waiting for rank 0 to
//     publish them) and claims the next free rank; it rewrites the options' rank,
//     world_size and max_world_size.
//   - Form(self, deadline), once this worker announced itself: Start's group waits for
//     every rank's record (rank 0 then publishes the group's size and capacity); a worker
//     that joins reads every member the store knows of (and which of them left).
//     Either way Peers learns the group and the names by rank go to Hooks::names.
//   - Introduce(deadline), for a worker that joined: sends JoinNotice to every member and
//     waits for the answers, so that once Start returns every member knows it. A member
//     that does not answer (dead or gone) is skipped, with a line on stderr.
//   - OnJoined(w) (on the I/O thread that admitted a joiner's hello) and OnLeaveNotice
//     (rank) (on the I/O thread that read a LeaveNotice) tell the watches; OnLeaveNotice
//     first marks the member left and lets Hooks::left let go of it, once per rank.
//   - TellLeaving(deadline), for Agent::Leave: LeaveNotice to every other member, waiting
//     for the answers (the dead do not answer) until `deadline`.
//   - GoneError(rank): UNAVAILABLE naming a member that left or was declared dead.
//   - The agent serves JoinNotice and LeaveNotice (it owns the registry) and sends the
//     notices through Hooks::notify; this unit includes no agent.
//   - Thread-safe.
#ifndef GRADWIRE_RPC_SRC_CLUSTER_MEMBERSHIP_H_
#define GRADWIRE_RPC_SRC_CLUSTER_MEMBERSHIP_H_

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/watchers.h"
#include "cluster/members.h"
#include "cluster/peers.h"
#include "cluster/rendezvous.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/worker.h"

namespace gw::rpc::internal {

// The agent's own membership messages ("__agent." names: no layer's call hooks see them).
// A worker that joined introduces itself to a member: its hello admitted it; the answer
// says so.
struct JoinNotice {
  static constexpr char kFunction[] = "__agent.join";
  using Reply = Ack;
  static constexpr auto Fields() { return std::tuple<>(); }
};
// A member tells the others it leaves the group (Agent::Leave).
struct LeaveNotice {
  static constexpr char kFunction[] = "__agent.leave";
  using Reply = Ack;
  static constexpr auto Fields() { return std::tuple<>(); }
};

class Membership {
 public:
  struct Hooks {
    // Sends the notice `function` (a message without fields) to `to`, answered by `deadline`.
    std::function<Future<Ack>(const std::string& to, const std::string& function, absl::Time deadline)> notify;
    // The names by rank changed (a group formed, a worker joined).
    std::function<void(std::vector<std::string> names)> names;
    // A member left: its calls fail from now on, and the layers let go of it as of a dead
    // peer. Returns false once the agent is closed (then no watch is told).
    std::function<bool(int rank)> left;
  };

  static absl::Status ClaimRank(Rendezvous& rendezvous, AgentOptions& options, absl::Time deadline);

  // REQUIRES: the units outlive this one; `self_rank` is this worker's (claimed) rank.
  Membership(const AgentOptions& options, Rendezvous& rendezvous, Members& members, Peers& peers, Hooks hooks)
      : options_(options), rendezvous_(rendezvous), members_(members), peers_(peers), hooks_(std::move(hooks)) {}

  absl::Status Form(const WorkerInfo& self, absl::Time deadline);
  void Introduce(absl::Time deadline);
  void OnJoined(const WorkerInfo& w);
  void OnLeaveNotice(int rank);
  void TellLeaving(absl::Time deadline);

  std::string NameOf(int rank) const { return members_.Name(rank); }
  absl::Status GoneError(int rank) const;
  [[nodiscard]] std::shared_ptr<void> Watch(std::function<void(const MemberChange&)> fn) {
    return watchers_->Add(std::move(fn));
  }

 private:
  absl::Status AwaitGroup(absl::Time deadline);
  absl::Status FindMembers(const WorkerInfo& self, absl::Time deadline);
  void UpdateNames();
  // Sends the notice to every other member; waits for the answers by `deadline`.
  void TellAll(const std::string& function, absl::Time deadline, const char* failed);

  const AgentOptions& options_;
  Rendezvous& rendezvous_;
  Members& members_;
  Peers& peers_;
  const Hooks hooks_;
  const std::shared_ptr<Watchers<MemberChange>> watchers_ = std::make_shared<Watchers<MemberChange>>();
  absl::Mutex names_mu_;  // UpdateNames, one at a time: two joining at once, the later list is the fuller
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CLUSTER_MEMBERSHIP_H_
