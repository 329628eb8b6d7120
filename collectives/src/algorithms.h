// Internal: the algorithms of the collectives, each run on the group's thread as one Op
// (group_state.h). Tensors are contiguous and one-dimensional ("flat") unless said
// otherwise; group ranks throughout.
//
//   AllReduceRecursiveDoubling  small tensors: log2(p) exchanges of the whole tensor
//       between partners r ^ 2^i among the largest power of two p <= n; ranks p..n-1
//       first hand their tensor to rank r - p and get the result back at the end.
//       Each exchange combines the same pair on both partners (commutative), so every
//       member ends with the same bits.
//   AllReduceRing  large tensors: reduce-scatter then allgather around the ring r -> r+1,
//       the tensor in n chunks, each chunk in pieces: a piece is reduced (or copied) as
//       it arrives and forwarded at once, so the steps overlap (pipelined). Each chunk is
//       reduced along one path and then copied: every member gets the same bits.
//   BroadcastTree   a binomial tree rooted at `root`.
//   AllGatherDirect (small: everyone sends to everyone) and AllGatherRing.
//   ReduceScatterRing, AllToAllDirect, BarrierDissemination (log2 n rounds).
#ifndef GRADWIRE_COLLECTIVES_SRC_ALGORITHMS_H_
#define GRADWIRE_COLLECTIVES_SRC_ALGORITHMS_H_

#include <vector>

#include "absl/status/status.h"
#include "gradwire/collectives/reduce_op.h"
#include "gradwire/tensor/tensor.h"
#include "group_state.h"

namespace gw::collectives::internal {

absl::Status AllReduceRecursiveDoubling(Op& op, const Tensor& flat, ReduceOp reduce);
absl::Status AllReduceRing(Op& op, const Tensor& flat, ReduceOp reduce);
absl::Status BroadcastTree(Op& op, const Tensor& flat, int root);
// out[r] = flat (a copy); the others as received (any shape: they take `shape`).
absl::Status AllGatherDirect(Op& op, const Tensor& flat, std::vector<Tensor>* out);
absl::Status AllGatherRing(Op& op, const Tensor& flat, std::vector<Tensor>* out);
// inputs: size() flat tensors; *out: the reduction of inputs[rank()].
absl::Status ReduceScatterRing(Op& op, const std::vector<Tensor>& inputs, ReduceOp reduce, Tensor* out);
// out[s] = what member s sent to this one (out[rank()] = a copy of inputs[rank()]).
absl::Status AllToAllDirect(Op& op, const std::vector<Tensor>& inputs, std::vector<Tensor>* out);
absl::Status BarrierDissemination(Op& op);

}  // namespace gw::collectives::internal

#endif  // GRADWIRE_COLLECTIVES_SRC_ALGORITHMS_H_
