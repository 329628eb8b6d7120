// Collectives: the collectives layer of one agent, which makes process groups.
//
// Contract
//   - Collectives::Install(agent), in Agent::Start's setup (so that no peer's message can
//     arrive before it exists), registers the layer's messages (process_group.h). One per
//     agent; installing twice is ALREADY_EXISTS.
//   - NewGroup(ranks, options) makes the group of the given agent ranks (empty: every
//     worker), on this worker, which must be one of them. Every member makes it with the
//     same ranks and options.name, as with torch.distributed.new_group: members that make
//     several groups over the same ranks and name make them in the same order. Members
//     need not make the group at the same moment: data that arrives for a group not made
//     here yet waits for it (at most kMaxEarlyMessages pieces; beyond that the sender's
//     collective fails with RESOURCE_EXHAUSTED). Data for a group that was made here and
//     is gone (closed and destroyed; the last kRetiredGroups of them) is not held: a
//     member's abort is dropped, a piece refused with UNAVAILABLE.
//   - INVALID_ARGUMENT for a rank out of range, a duplicate, or this worker not a member.
//   - A message from a worker that is not a member of its group is refused with
//     INVALID_ARGUMENT; so is one whose fields are malformed (wrong size or dtype for the
//     step it claims): it fails that collective (every member is told), never reads out
//     of range.
//   - Thread-safe. REQUIRES: the agent outlives this object and its groups.
#ifndef GRADWIRE_COLLECTIVES_COLLECTIVES_H_
#define GRADWIRE_COLLECTIVES_COLLECTIVES_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/collectives/process_group.h"
#include "gradwire/rpc/agent.h"

namespace gw::collectives {

inline constexpr size_t kMaxEarlyMessages = 4096;
inline constexpr size_t kRetiredGroups = 4096;

class Collectives {
 public:
  // REQUIRES: called in Agent::Start's setup.
  static absl::StatusOr<std::shared_ptr<Collectives>> Install(rpc::Agent& agent);
  ~Collectives();

  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewGroup(std::vector<int> ranks = {}, GroupOptions options = {});
  // Pieces (and aborts) held for groups not made here yet; AwaitEarly waits (on the event,
  // not by polling) until at least `n` are held or the deadline passes, and says which.
  size_t early() const;
  bool AwaitEarly(size_t n, absl::Time deadline) const;

  class Impl;

 private:
  explicit Collectives(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace gw::collectives

#endif  // GRADWIRE_COLLECTIVES_COLLECTIVES_H_
