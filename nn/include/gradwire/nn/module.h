// Module: a named tree of parameters, buffers and submodules with a forward function.
//
// Contract
//   - Parameters are leaf tensors with requires_grad; buffers are state that is saved
//     but not trained. Names are dotted paths through the tree ("0.weight").
//   - Modules are held by std::shared_ptr and registered by name in their parent; a
//     module may be shared by several parents. NamedParameters lists each parameter
//     once, under the first name it is reached by (so optimizers see tied weights once).
//   - Forward(x) is the single-tensor forward used by Sequential; modules with other
//     signatures (EmbeddingBag) add their own overloads.
//   - StateDict/LoadStateDict copy values in place, so optimizers and references to the
//     parameter tensors stay valid. Save/Load use the named-tensor file of serialize.h:
//     Load refuses a damaged file and NaN or infinite values (LoadTensors' defaults).
//     SaveSafetensors/LoadSafetensors use the safetensors file of safetensors.h (PyTorch's
//     state-dict keys, e.g. "0.weight", so files move between the two), with the same
//     checks; a BF16/F16 file loads into a float32 module. The format is chosen by the
//     method, never by the file's name.
//   - Devices: a module lives where its parameters are (To moves them all); Forward expects
//     inputs on that device. LoadStateDict takes tensors from any device.
//   - Thread safety: concurrent Forward calls (with or without grad) are safe for modules
//     without mutable state (all but Dropout in training mode); mutation (training,
//     loading) needs exclusion.
#ifndef GRADWIRE_NN_MODULE_H_
#define GRADWIRE_NN_MODULE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gradwire/tensor/tensor.h"

namespace gw::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor Forward(const Tensor& input);

  const std::string& type_name() const { return type_name_; }
  // "Linear(in_features=4, out_features=2, bias=true)"; containers print their children.
  virtual std::string ToString() const;

  NamedTensors NamedParameters(bool recurse = true) const;
  std::vector<Tensor> Parameters(bool recurse = true) const;
  NamedTensors NamedBuffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  int64_t NumParameters() const;

  void Train(bool on = true);
  void Eval() { Train(false); }
  bool is_training() const { return training_; }
  // Sets every parameter's gradient to undefined.
  void ZeroGrad();
  // Moves every parameter and buffer, and the parameters' gradients, to `device`, in place:
  // each keeps its identity (the handles the module's code, optimizers and hooks hold stay
  // valid; views taken of them before stay where they were). Throws gw::Error naming the
  // device when this process cannot use it; then nothing has moved.
  void To(Device device);
  // The device of the first parameter or buffer (the CPU for a module without any).
  Device device() const;

  // Parameters and buffers, by dotted name, in PyTorch's order (each module's parameters,
  // then its buffers, then its children's, depth first).
  NamedTensors StateDict() const;
  // Copies `state` into the parameters and buffers. With `strict`, missing or unexpected
  // names are an error. Shape or dtype mismatches and a name given twice are always an
  // error. Errors name the entry; on error nothing has been modified.
  absl::Status LoadStateDict(const NamedTensors& state, bool strict = true);
  absl::Status Save(const std::string& path) const;
  absl::Status Load(const std::string& path, bool strict = true);
  // `metadata`: the file's __metadata__ (safetensors.h adds "gradwire.crc32c").
  absl::Status SaveSafetensors(const std::string& path,
                               const std::map<std::string, std::string>& metadata = {}) const;
  absl::Status LoadSafetensors(const std::string& path, bool strict = true);

 protected:
  // REQUIRES: `name` is unique among this module's parameters, buffers and children.
  Tensor RegisterParameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor RegisterBuffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> RegisterModule(const std::string& name, std::shared_ptr<M> module) {
    RegisterChild(name, module);
    return module;
  }
  // Extra text inside the parentheses of ToString().
  virtual std::string ExtraRepr() const { return ""; }

 private:
  void RegisterChild(const std::string& name, std::shared_ptr<Module> module);
  void CheckNewName(const std::string& name) const;
  enum class Kinds { kParameters, kBuffers, kBoth };
  void Collect(const std::string& prefix, bool recurse, Kinds kinds, NamedTensors* out) const;

  std::string type_name_;
  bool training_ = true;
  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace gw::nn

#endif  // GRADWIRE_NN_MODULE_H_
