// Recurrent layers LSTM and GRU, with PyTorch's arguments, parameters and results.
//
// Contract
//   - LSTM(input_size, hidden_size, gen, options, dtype) and GRU(...) stack num_layers
//     layers, each optionally bidirectional; layer k > 0 reads the previous layer's output
//     (dirs * hidden_size features), with dropout on it in training mode when
//     options.dropout > 0 (not after the last layer). Cells and gate order are PyTorch's
//     (LSTM i, f, g, o; GRU r, z, n with n = tanh(W_in x + b_in + r * (W_hn h + b_hn))).
//   - Parameters, in PyTorch's order and names: weight_ih_l{k}[_reverse] [G*H, in_k],
//     weight_hh_l{k}[_reverse] [G*H, H], bias_ih_l{k}[_reverse] and bias_hh_l{k}[_reverse]
//     [G*H] (without bias: none), G = 4 (LSTM) or 3 (GRU); all ~ U(-1/sqrt(H), 1/sqrt(H))
//     drawn from `gen` in that order. State dicts therefore load PyTorch's.
//   - Forward(input, h0, c0): input [L, N, in] ([N, L, in] with batch_first; any strides)
//     or unbatched [L, in]; h0 and c0 [num_layers * dirs, N, H] ([num_layers * dirs, H]
//     unbatched) or undefined (zeros). Returns output [L, N, dirs * H] ([N, L, dirs * H]
//     with batch_first, [L, dirs * H] unbatched) and h_n (and c_n) shaped like h0.
//     Forward(input) returns the output alone (for Sequential).
//   - ToString() is PyTorch's repr with gradwire's spelling, defaults left out:
//     "LSTM(28, 128, num_layers=2, batch_first=true)".
//   - Errors: gw::Error naming the module as ToString() prints it, e.g.
//     "LSTM(28, 128, num_layers=2): expected input [L, N, 28] (batch_first=false), got
//     [64, 784]"; input dtype must be the parameters'.
//   - Thread safety: concurrent Forward calls are safe in eval mode or without dropout
//     (dropout draws from the module's own generator).
#ifndef GRADWIRE_NN_RECURRENT_H_
#define GRADWIRE_NN_RECURRENT_H_

#include <memory>
#include <string>
#include <vector>

#include "gradwire/nn/layers.h"
#include "gradwire/nn/module.h"
#include "gradwire/tensor/recurrent.h"

namespace gw::nn {

struct RnnOptions {
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  double dropout = 0;  // between layers, in training mode; REQUIRES 0 <= dropout < 1
  bool bidirectional = false;
};

// What LSTM and GRU share: parameters, shape checks, the layer stack.
class RnnBase : public Module {
 public:
  Tensor Forward(const Tensor& input) override;

  int64_t input_size() const { return input_size_; }
  int64_t hidden_size() const { return hidden_size_; }
  const RnnOptions& options() const { return options_; }

 protected:
  RnnBase(kernels::RnnCell cell, int64_t input_size, int64_t hidden_size, Generator& gen,
          const RnnOptions& options, DType dtype);
  struct States {
    Tensor output, h_n, c_n;
  };
  States Run(const Tensor& input, const Tensor& h0, const Tensor& c0);
  std::string ExtraRepr() const override;

 private:
  struct LayerWeights {
    Tensor w_ih, w_hh, b_ih, b_hh;
  };
  int64_t directions() const { return options_.bidirectional ? 2 : 1; }
  void CheckState(const char* name, const Tensor& state, bool batched, int64_t batch) const;

  kernels::RnnCell cell_;
  int64_t input_size_, hidden_size_;
  RnnOptions options_;
  DType dtype_;
  std::vector<LayerWeights> weights_;  // layer * directions + direction
  std::unique_ptr<Dropout> dropout_;   // not a child: it has no state to save
};

class LSTM : public RnnBase {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, Generator& gen, const RnnOptions& options = {},
       DType dtype = DType::kFloat32);
  struct Output {
    Tensor output, h_n, c_n;
  };
  // h0 and c0 are given together or not at all (PyTorch's (h_0, c_0) tuple).
  Output Forward(const Tensor& input, const Tensor& h0, const Tensor& c0);
  using RnnBase::Forward;
};

class GRU : public RnnBase {
 public:
  GRU(int64_t input_size, int64_t hidden_size, Generator& gen, const RnnOptions& options = {},
      DType dtype = DType::kFloat32);
  struct Output {
    Tensor output, h_n;
  };
  Output Forward(const Tensor& input, const Tensor& h0);
  using RnnBase::Forward;
};

}  // namespace gw::nn

#endif  // GRADWIRE_NN_RECURRENT_H_
