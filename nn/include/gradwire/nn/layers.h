// Layers: Linear, activations (ReLU, Tanh, Sigmoid, GELU, SiLU), Flatten, Dropout,
// Dropout2d, Sequential. Names, arguments and ToString follow PyTorch's modules.
//
// Contract
//   - Initialisation follows PyTorch's defaults, drawn from an explicit Generator:
//     Linear weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with a=sqrt(5)).
//   - Shapes: Linear maps [..., in] to [..., out]; Flatten merges dims start_dim..end_dim
//     (default [N, ...] -> [N, prod(...)]); activations keep the shape. Errors are gw::Error
//     naming the layer and the shapes.
//   - Dropout zeroes each element with probability p in training mode and scales the rest
//     by 1/(1-p); Dropout2d does so for whole channels of [N, C, H, W] (or [N, C, L], as
//     PyTorch 1.13 treats 3-D input). In eval mode both are the identity. Each owns a
//     Generator forked at construction, so it is not safe to call concurrently in training
//     mode.
#ifndef GRADWIRE_NN_LAYERS_H_
#define GRADWIRE_NN_LAYERS_H_

#include <memory>
#include <vector>

#include "gradwire/nn/module.h"
#include "gradwire/tensor/kernels.h"  // GeluApproximate

namespace gw::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen, bool bias = true,
         DType dtype = DType::kFloat32);
  Tensor Forward(const Tensor& input) override;

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 protected:
  std::string ExtraRepr() const override;

 private:
  int64_t in_features_, out_features_;
  Tensor weight_, bias_;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor Forward(const Tensor& input) override;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor Forward(const Tensor& input) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor Forward(const Tensor& input) override;
};

// GELU(approximate='none') or GELU(approximate='tanh'), as torch.nn.GELU.
class GELU : public Module {
 public:
  // `approximate` is "none" or "tanh" (PyTorch's strings); anything else throws.
  explicit GELU(const std::string& approximate = "none");
  explicit GELU(GeluApproximate approximate);
  Tensor Forward(const Tensor& input) override;

 protected:
  std::string ExtraRepr() const override;

 private:
  GeluApproximate approximate_;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor Forward(const Tensor& input) override;
};

// Flatten(start_dim=1, end_dim=-1), as torch.nn.Flatten.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor Forward(const Tensor& input) override;

 protected:
  std::string ExtraRepr() const override;

 private:
  int64_t start_dim_, end_dim_;
};

class Dropout : public Module {
 public:
  // REQUIRES: 0 <= p < 1.
  Dropout(double p, Generator& gen);
  Tensor Forward(const Tensor& input) override;

 protected:
  Dropout(std::string type_name, double p, Generator& gen);
  std::string ExtraRepr() const override;

  double p_;
  Generator gen_;
};

// Channel dropout for [N, C, H, W] (torch.nn.Dropout2d): zeroes whole (n, c) planes.
class Dropout2d : public Dropout {
 public:
  // REQUIRES: 0 <= p < 1.
  Dropout2d(double p, Generator& gen);
  Tensor Forward(const Tensor& input) override;
};

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  // Appends a module named by its position ("0", "1", ...).
  void Push(std::shared_ptr<Module> module);
  Tensor Forward(const Tensor& input) override;
  size_t size() const { return children().size(); }
  std::string ToString() const override;
};

}  // namespace gw::nn

#endif  // GRADWIRE_NN_LAYERS_H_
