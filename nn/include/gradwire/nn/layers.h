// Layers: Linear, activations, Dropout, Sequential.
//
// Contract
//   - Initialisation follows PyTorch's defaults, drawn from an explicit Generator:
//     Linear weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with a=sqrt(5)).
//   - Shapes: Linear maps [..., in] to [..., out]. Errors are gw::Error naming the layer.
//   - Dropout zeroes each element with probability p in training mode and scales the rest
//     by 1/(1-p); in eval mode it is the identity. It owns a Generator forked at
//     construction, so it is not safe to call concurrently in training mode.
#ifndef GRADWIRE_NN_LAYERS_H_
#define GRADWIRE_NN_LAYERS_H_

#include <memory>
#include <vector>

#include "gradwire/nn/module.h"

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

class Dropout : public Module {
 public:
  // REQUIRES: 0 <= p < 1.
  Dropout(double p, Generator& gen);
  Tensor Forward(const Tensor& input) override;

 protected:
  std::string ExtraRepr() const override;

 private:
  double p_;
  Generator gen_;
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
