// RemoteModule: an nn::Module that lives on one worker and is called from many.
//
// Contract
//   - Module factories are registered by name on the workers that may host modules:
//       RegisterModuleFactory(agent, "mlp", [](int64_t hidden) { return std::make_shared<Mlp>(hidden); });
//     A factory takes arguments with ValueTraits and returns a std::shared_ptr to any
//     nn::Module subclass. Registering one also serves the method messages RemoteModule
//     sends (ModuleForward, ModuleParameters, ModuleDescribe, ModuleState in
//     dist_nn/src/module_messages.h), once per agent.
//   - RemoteModule::Create(agent, worker, factory, args...) builds the module on `worker`
//     and returns once it exists, or the factory's error (NOT_FOUND for an unknown
//     factory: "worker1 has no module factory 'mlp' (register it with
//     dist_nn::RegisterModuleFactory in that worker's Agent::Start setup; functions
//     registered there: ...)").
//   - Forward(x) / ForwardAsync(x) run module->Forward(x) on its worker. Any number of
//     clients and threads may call one RemoteModule concurrently (nn::Module's Forward
//     contract: modules without mutable state). Inside a distributed-autograd context the
//     forward is recorded there, so the backward reaches the module's parameters.
//   - RemoteParameters() returns RRefs of the module's parameters, owned by its worker:
//     the parameter tensors themselves (an optimizer step there changes the module).
//     FetchParameters() copies them here by name; in a distributed-autograd context the
//     copies route their gradients back to the module's worker (fetching the whole module).
//   - module_rref() is the module's RRef, for user-registered methods that take
//     std::shared_ptr<nn::Module> as first parameter (rref.Sync<R>("method", ...)); it
//     can be sent to other workers, which wrap it with FromRRef.
//   - Copies share the module; it is freed on its worker when the last copy anywhere is
//     gone (RRef protocol, rref.h). Thread-safe.
#ifndef GRADWIRE_DIST_NN_REMOTE_MODULE_H_
#define GRADWIRE_DIST_NN_REMOTE_MODULE_H_

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gradwire/nn/module.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rref.h"

namespace gw::dist_nn {

using ModuleRRef = rpc::RRef<std::shared_ptr<nn::Module>>;

namespace internal {

// A factory with the user's parameter list that returns the module as nn::Module.
template <typename F, typename Args>
struct ModuleFactory;
template <typename F, typename... A>
struct ModuleFactory<F, std::tuple<A...>> {
  F make;
  absl::StatusOr<std::shared_ptr<nn::Module>> operator()(A... args) const {
    std::shared_ptr<nn::Module> m = make(std::move(args)...);
    if (!m) return absl::FailedPreconditionError("the module factory returned no module (null)");
    return m;
  }
};

absl::Status RegisterModuleMethods(rpc::Agent& agent);

}  // namespace internal

template <typename F>
absl::Status RegisterModuleFactory(rpc::Agent& agent, const std::string& name, F factory) {
  if (absl::Status s = internal::RegisterModuleMethods(agent); !s.ok()) return s;
  using Args = typename rpc::internal::FnTraits<std::decay_t<F>>::Args;
  return agent.Register(name, internal::ModuleFactory<std::decay_t<F>, Args>{std::move(factory)});
}

class RemoteModule {
 public:
  template <typename... Args>
  static absl::StatusOr<RemoteModule> Create(rpc::Agent& agent, const std::string& worker, const std::string& factory,
                                             Args&&... args) {
    return Created(agent.Remote<std::shared_ptr<nn::Module>>(worker, factory, std::forward<Args>(args)...), worker,
                   factory);
  }

  // A RemoteModule for a module RRef received from another worker (module_rref() sent
  // as an argument or result).
  static RemoteModule FromRRef(ModuleRRef module) { return RemoteModule(std::move(module)); }

  absl::StatusOr<Tensor> Forward(const Tensor& input, rpc::CallOptions options = {}) const;
  Future<Tensor> ForwardAsync(const Tensor& input, rpc::CallOptions options = {}) const;
  absl::StatusOr<std::vector<rpc::RRef<Tensor>>> RemoteParameters(rpc::CallOptions options = {}) const;
  // Copies of the module's parameters by dotted name ("0.weight"), fetched here. Inside a
  // distributed-autograd context they stay linked to the originals: gradients computed
  // through them land on the module's worker, not on the copies.
  absl::StatusOr<std::map<std::string, Tensor>> FetchParameters(rpc::CallOptions options = {}) const;
  // The module's ToString(), as built on its worker.
  absl::StatusOr<std::string> Describe() const;

  const ModuleRRef& module_rref() const { return module_; }
  std::string worker() const { return module_.Owner(); }

 private:
  explicit RemoteModule(ModuleRRef module) : module_(std::move(module)) {}
  static absl::StatusOr<RemoteModule> Created(ModuleRRef module, const std::string& worker, const std::string& factory);

  ModuleRRef module_;
};

}  // namespace gw::dist_nn

#endif  // GRADWIRE_DIST_NN_REMOTE_MODULE_H_
