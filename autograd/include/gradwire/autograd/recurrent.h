// Differentiable recurrent layers: one LSTM or GRU layer, one direction, over a whole
// sequence, as one autograd node (the math is gw::kernels::RnnLayerForward/Backward in
// gradwire/tensor/recurrent.h, which documents cells, gate order and shapes).
//
// Contract
//   - RnnLayer(args) returns output [L, N, H], h_n [N, H] and (LSTM) c_n [N, H]. When grad
//     mode is on and any of x, h0, c0, w_ih, w_hh, b_ih, b_hh requires grad, the three
//     outputs share one backward node that keeps the activated gates of every step and
//     computes only the gradients the inputs that require grad need; gradients of the
//     outputs that are not used count as zero.
//   - Inputs may be strided (e.g. a transposed batch-first sequence); h_n is a view of the
//     output's last step read. Saved tensors are version-checked: modifying an input or
//     output in place before backward is a gw::Error.
//   - Errors are the kernels' (gw::Error naming "LSTM layer" / "GRU layer" and shapes).
//   - Thread safety: as the kernels; no shared state.
#ifndef GRADWIRE_AUTOGRAD_RECURRENT_H_
#define GRADWIRE_AUTOGRAD_RECURRENT_H_

#include "gradwire/tensor/recurrent.h"
#include "gradwire/tensor/tensor.h"

namespace gw {

struct RnnLayerOutputs {
  Tensor output;  // [L, N, H]
  Tensor h_n;     // [N, H]
  Tensor c_n;     // [N, H], LSTM only
};

RnnLayerOutputs RnnLayer(const kernels::RnnLayerArgs& args);

}  // namespace gw

#endif  // GRADWIRE_AUTOGRAD_RECURRENT_H_
