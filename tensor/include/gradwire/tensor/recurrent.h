// gw::kernels recurrent layers: one LSTM or GRU layer, one direction, over a whole
// sequence, forward and backward (raw math, no autograd; see gradwire/autograd/recurrent.h
// for the differentiable form and gradwire/nn/recurrent.h for the modules).
//
// Contract
//   - Cells and gate order are PyTorch's. H is the hidden size, G the gate count (4 for
//     LSTM, 3 for GRU); weights are stacked by gate along their first dimension:
//       LSTM (i, f, g, o): i = s(W_ii x + b_ii + W_hi h + b_hi), f, o alike, g with tanh,
//                          c' = f * c + i * g,  h' = o * tanh(c');
//       GRU  (r, z, n):    r, z as above, n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),
//                          h' = (1 - z) * n + z * h.
//   - Shapes: x [L, N, in] (time-major; any strides), h0 and c0 [N, H] or undefined
//     (zeros), w_ih [G*H, in], w_hh [G*H, H], b_ih and b_hh [G*H] or undefined (no bias).
//     c0 is LSTM only. `reverse` runs the sequence from the last step to the first (the
//     backward direction of a bidirectional layer): output[t] is then the state after
//     reading x[L-1] ... x[t], and h_n the state after x[0].
//   - Forward returns the contiguous output [L, N, H], h_n [N, H] (a view of the output's
//     last step read), c_n [N, H] (LSTM) and the saved activations that Backward needs:
//     `gates` [L, N, G*H] (the activated gates) and `aux` [L, N, H] (LSTM: the cell state
//     of each step; GRU: W_hn h + b_hn of each step). Nothing else is kept.
//   - Backward takes the forward's arguments and result and the gradients of output, h_n
//     and c_n (each may be undefined, meaning zero) and computes only the gradients
//     `needs` asks for; the others are undefined. Gradients are contiguous and shaped like
//     their inputs.
//   - Implementation: one GEMM for the input projection of all steps, one GEMM per step
//     for the hidden projection, a fused gate kernel per step (forward and backward), and
//     one GEMM each for the gradients of x, w_ih and w_hh over all steps. float32 GEMMs
//     are oneDNN's sgemm and its gate kernels use a vectorised exp/tanh (within a few ulp
//     of libm's); float64 runs the same code with gradwire's own GEMM and libm.
//   - Errors: shape or dtype mismatches throw gw::Error naming "LSTM layer" or
//     "GRU layer" and the shapes. Thread safety: no shared state; concurrent calls are
//     safe.
#ifndef GRADWIRE_TENSOR_RECURRENT_H_
#define GRADWIRE_TENSOR_RECURRENT_H_

#include <cstdint>
#include <string_view>

#include "gradwire/tensor/tensor.h"

namespace gw::kernels {

enum class RnnCell { kLstm, kGru };

// 4 for LSTM, 3 for GRU.
int64_t RnnGateCount(RnnCell cell);
// "LSTM layer" or "GRU layer", the op name in errors.
std::string_view RnnLayerName(RnnCell cell);

struct RnnLayerArgs {
  RnnCell cell = RnnCell::kLstm;
  Tensor x, h0, c0;
  Tensor w_ih, w_hh, b_ih, b_hh;
  bool reverse = false;
};

struct RnnLayerResult {
  Tensor output;  // [L, N, H]
  Tensor h_n;     // [N, H]
  Tensor c_n;     // [N, H], LSTM only
  Tensor gates;   // [L, N, G*H], saved for Backward
  Tensor aux;     // [L, N, H], saved for Backward
};

// Which gradients Backward computes.
struct RnnLayerNeeds {
  bool x = true, h0 = true, c0 = true, w_ih = true, w_hh = true, b_ih = true, b_hh = true;
};

struct RnnLayerGrads {
  Tensor x, h0, c0, w_ih, w_hh, b_ih, b_hh;
};

RnnLayerResult RnnLayerForward(const RnnLayerArgs& args);

RnnLayerGrads RnnLayerBackward(const RnnLayerArgs& args, const RnnLayerResult& forward,
                               const Tensor& grad_output, const Tensor& grad_h_n,
                               const Tensor& grad_c_n, const RnnLayerNeeds& needs);

}  // namespace gw::kernels

#endif  // GRADWIRE_TENSOR_RECURRENT_H_
