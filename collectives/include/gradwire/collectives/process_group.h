// ProcessGroup: collectives (allreduce, broadcast, allgather, reduce_scatter,
// all_to_all, barrier) among a set of workers of one agent group, over the agent's
// connections and transports (the shared-memory arena between processes of one host,
// TCP across hosts).
//
// Contract
//   - Made by Collectives::NewGroup (collectives.h) on every member, with the same ranks
//     and name. rank() is this worker's position in ranks() (the agent ranks, sorted).
//   - Every collective returns at once a Future that completes when it is done on this
//     worker (an asynchronous work handle). Collectives of one group run one at a time,
//     in the order they were issued, which must be the same order on every member; they
//     overlap with the caller's computation and with the collectives of other groups.
//     Tensors passed in are owned by the collective until its future completes: do not
//     read or write them meanwhile. In-place collectives (AllReduce, Broadcast) complete
//     with the tensor they were given.
//   - Tensors: float32, float64 or int64 (reductions: reduce_op.h), any shape, any
//     number of elements including 0, contiguous or not (a non-contiguous one is
//     reduced in a contiguous copy and written back).
//   - Every member gets bitwise the same result of a reduction (each element is
//     combined along one path, or by commutative pairs).
//   - Algorithms by size: tensors of at most GroupOptions::small_bytes take the
//     latency-bound ones (recursive doubling for allreduce, with the ranks beyond the
//     largest power of two folded in first; direct exchange for allgather; a binomial
//     tree for broadcast); larger ones the bandwidth-bound ring (reduce-scatter then
//     allgather, in pieces of piece_bytes; a received piece is reduced where the
//     transport put it, e.g. straight out of the shared-memory arena).
//   - Failures (agent.h's failure model), never a hang:
//       INVALID_ARGUMENT  the ranks disagree on the collective, dtype or shape (every
//                         member fails, the message names the ranks and what each
//                         has), or a tensor cannot be reduced; the group stays usable.
//       UNAVAILABLE       a member died (its connections closed) or cannot be reached:
//                         the pending collective and every later one fail on every
//                         member, naming it; the group is broken for good.
//       DEADLINE_EXCEEDED a collective did not finish within GroupOptions::timeout of
//                         starting (e.g. a member froze or never issued it), naming the
//                         ranks it still waited for; the group is broken for good.
//       CANCELLED         the group was closed, or this agent is shutting down.
//     A collective that completed on one member completes on every member, whatever that
//     member does next: a member that closes its group (Close(), its destructor, the end
//     of the program) breaks it for the others from its next collective on, never the
//     ones it completed (a training loop's last allreduce before Close() is the normal case).
//     A member that fails a collective tells the others (a CollectiveAbort), so they fail
//     it too instead of waiting for their deadline.
//   - Messages (collectives/src/messages.h): CollectiveChunk (one piece of data of one
//     step of one collective, with the sender's signature of it) and CollectiveAbort.
//   - Close() (and the destructor) fails what is queued with CANCELLED and stops the
//     group's thread. Thread-safe. REQUIRES: the agent outlives its groups.
#ifndef GRADWIRE_COLLECTIVES_PROCESS_GROUP_H_
#define GRADWIRE_COLLECTIVES_PROCESS_GROUP_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gradwire/collectives/reduce_op.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/message.h"
#include "gradwire/tensor/tensor.h"

namespace gw::collectives {

struct GroupOptions {
  // Tells groups over the same ranks apart; every member passes the same name.
  std::string name;
  // Bound of each collective from when it starts running (zero: the agent's default_timeout).
  absl::Duration timeout = absl::ZeroDuration();
  // Tensors of at most this many bytes take the latency-bound algorithms.
  size_t small_bytes = size_t{64} << 10;
  // The ring moves its chunks in pieces of at most this many bytes.
  size_t piece_bytes = size_t{4} << 20;
  // A collective waiting for data polls this long before it sleeps (a wake-up of an idle
  // thread costs 15-40 us on a VM, more than a small collective). Zero: never polls.
  absl::Duration spin = absl::Microseconds(50);
};

class GroupState;  // internal

class ProcessGroup {
 public:
  explicit ProcessGroup(std::shared_ptr<GroupState> state);
  ~ProcessGroup();  // Close()
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  const std::vector<int>& ranks() const;  // agent rank of each member
  const std::string& name() const;

  // t = t[rank 0] (op) t[rank 1] (op) ... on every member, in place.
  Future<Tensor> AllReduce(Tensor t, ReduceOp op = ReduceOp::kSum);
  // t = t[root] on every member, in place (root: a group rank).
  Future<Tensor> Broadcast(Tensor t, int root);
  // Every member's t, by group rank (each a new tensor; shapes must agree).
  Future<std::vector<Tensor>> AllGather(Tensor t);
  // inputs[r] reduced over the members, on member r: `inputs` holds size() tensors; the
  // r-th must have the same shape on every member (shapes may differ between r's).
  Future<Tensor> ReduceScatter(std::vector<Tensor> inputs, ReduceOp op = ReduceOp::kSum);
  // outputs[s] = member s's inputs[rank()]: `inputs` holds size() tensors of one dtype
  // (any shapes; what a member sends is what its peer receives).
  Future<std::vector<Tensor>> AllToAll(std::vector<Tensor> inputs);
  // Completes once every member has issued it.
  Future<rpc::Ack> Barrier();

  void Close();

 private:
  std::shared_ptr<GroupState> state_;
};

}  // namespace gw::collectives

#endif  // GRADWIRE_COLLECTIVES_PROCESS_GROUP_H_
