#include "gradwire/nn/recurrent.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/recurrent.h"

namespace gw::nn {

RnnBase::RnnBase(kernels::RnnCell cell, int64_t input_size, int64_t hidden_size,
                 Generator& gen, const RnnOptions& options, DType dtype)
    : Module(cell == kernels::RnnCell::kLstm ? "LSTM" : "GRU"),
      cell_(cell),
      input_size_(input_size),
      hidden_size_(hidden_size),
      options_(options),
      dtype_(dtype) {
  GW_CHECK(input_size > 0 && hidden_size > 0 && options.num_layers > 0, ToString(),
           "input_size, hidden_size and num_layers must be positive");
  GW_CHECK(options.dropout >= 0 && options.dropout < 1, ToString(),
           "dropout must be in [0, 1), got ", options.dropout);
  GW_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat64, ToString(),
           "parameters must be float32 or float64, got ", DTypeName(dtype));
  const int64_t gates = kernels::RnnGateCount(cell) * hidden_size;
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  auto param = [&](const std::string& name, Shape sizes) {
    return RegisterParameter(name, Tensor::Uniform(sizes, -bound, bound, gen, dtype));
  };
  for (int64_t k = 0; k < options.num_layers; ++k) {
    const int64_t in = k == 0 ? input_size : hidden_size * directions();
    for (int64_t dir = 0; dir < directions(); ++dir) {
      const std::string suffix = absl::StrCat("_l", k, dir == 1 ? "_reverse" : "");
      LayerWeights w;
      w.w_ih = param("weight_ih" + suffix, {gates, in});
      w.w_hh = param("weight_hh" + suffix, {gates, hidden_size});
      if (options.bias) {
        w.b_ih = param("bias_ih" + suffix, {gates});
        w.b_hh = param("bias_hh" + suffix, {gates});
      }
      weights_.push_back(w);
    }
  }
  if (options.dropout > 0 && options.num_layers > 1) {
    dropout_ = std::make_unique<Dropout>(options.dropout, gen);
  }
}

std::string RnnBase::ExtraRepr() const {
  std::string out = absl::StrCat(input_size_, ", ", hidden_size_);
  if (options_.num_layers != 1) absl::StrAppend(&out, ", num_layers=", options_.num_layers);
  if (!options_.bias) absl::StrAppend(&out, ", bias=false");
  if (options_.batch_first) absl::StrAppend(&out, ", batch_first=true");
  if (options_.dropout != 0) absl::StrAppend(&out, ", dropout=", options_.dropout);
  if (options_.bidirectional) absl::StrAppend(&out, ", bidirectional=true");
  return out;
}

void RnnBase::CheckState(const char* name, const Tensor& state, bool batched,
                         int64_t batch) const {
  if (!state.defined()) return;
  Shape want{options_.num_layers * directions(), batch, hidden_size_};
  if (!batched) want.erase(want.begin() + 1);
  GW_CHECK(state.sizes() == want && state.dtype() == dtype_, ToString(), "expected ", name,
           " ", DTypeName(dtype_), ShapeToString(want), ", got ", DTypeName(state.dtype()),
           ShapeToString(state.sizes()));
}

RnnBase::States RnnBase::Run(const Tensor& input, const Tensor& h0, const Tensor& c0) {
  const bool ok = input.defined() && (input.dim() == 2 || input.dim() == 3) &&
                  input.sizes().back() == input_size_;
  GW_CHECK(ok, ToString(), "expected input ",
           options_.batch_first ? "[N, L, " : "[L, N, ", input_size_, "] (batch_first=",
           options_.batch_first ? "true" : "false", "), got ",
           input.defined() ? ShapeToString(input.sizes()) : "undefined");
  GW_CHECK(input.dtype() == dtype_, ToString(), "input is ", DTypeName(input.dtype()),
           " but the parameters are ", DTypeName(dtype_));
  const bool batched = input.dim() == 3;
  // Time-major [L, N, in] views: no copy here.
  Tensor x = !batched ? Unsqueeze(input, 1)
                      : options_.batch_first ? Transpose(input, 0, 1) : input;
  GW_CHECK(x.size(0) > 0, ToString(), "expected a sequence of length > 0, got input ",
           ShapeToString(input.sizes()));
  const int64_t batch = x.size(1);
  CheckState("h_0", h0, batched, batch);
  CheckState("c_0", c0, batched, batch);
  const Tensor h = h0.defined() && !batched ? Unsqueeze(h0, 1) : h0;
  const Tensor c = c0.defined() && !batched ? Unsqueeze(c0, 1) : c0;

  std::vector<Tensor> h_n, c_n;
  for (int64_t k = 0; k < options_.num_layers; ++k) {
    if (k > 0 && dropout_ != nullptr && is_training()) x = dropout_->Forward(x);
    std::vector<Tensor> outputs;
    for (int64_t dir = 0; dir < directions(); ++dir) {
      const int64_t index = k * directions() + dir;
      const LayerWeights& w = weights_[index];
      kernels::RnnLayerArgs args{cell_,
                                 x,
                                 h.defined() ? Select(h, 0, index) : Tensor(),
                                 c.defined() ? Select(c, 0, index) : Tensor(),
                                 w.w_ih,
                                 w.w_hh,
                                 w.b_ih,
                                 w.b_hh,
                                 /*reverse=*/dir == 1};
      RnnLayerOutputs r = RnnLayer(args);
      outputs.push_back(r.output);
      h_n.push_back(r.h_n);
      c_n.push_back(r.c_n);
    }
    x = outputs.size() == 1 ? outputs[0] : Cat(outputs, 2);
  }
  States s;
  s.output = !batched ? Squeeze(x, 1) : options_.batch_first ? Transpose(x, 0, 1) : x;
  s.h_n = Stack(h_n, 0);
  if (!batched) s.h_n = Squeeze(s.h_n, 1);
  if (cell_ == kernels::RnnCell::kLstm) {
    s.c_n = Stack(c_n, 0);
    if (!batched) s.c_n = Squeeze(s.c_n, 1);
  }
  return s;
}

Tensor RnnBase::Forward(const Tensor& input) { return Run(input, Tensor(), Tensor()).output; }

LSTM::LSTM(int64_t input_size, int64_t hidden_size, Generator& gen, const RnnOptions& options,
           DType dtype)
    : RnnBase(kernels::RnnCell::kLstm, input_size, hidden_size, gen, options, dtype) {}

LSTM::Output LSTM::Forward(const Tensor& input, const Tensor& h0, const Tensor& c0) {
  GW_CHECK(h0.defined() == c0.defined(), ToString(),
           "h_0 and c_0 must be given together (or neither)");
  States s = Run(input, h0, c0);
  return {s.output, s.h_n, s.c_n};
}

GRU::GRU(int64_t input_size, int64_t hidden_size, Generator& gen, const RnnOptions& options,
         DType dtype)
    : RnnBase(kernels::RnnCell::kGru, input_size, hidden_size, gen, options, dtype) {}

GRU::Output GRU::Forward(const Tensor& input, const Tensor& h0) {
  States s = Run(input, h0, Tensor());
  return {s.output, s.h_n};
}

}  // namespace gw::nn
