#include "gradwire/dist_nn/remote_module.h"

#include "module_messages.h"

namespace gw::dist_nn {

using internal::ModuleDescribe;
using internal::ModuleForward;
using internal::ModuleParameters;
using internal::ModuleState;
using Self = std::shared_ptr<nn::Module>;

absl::Status internal::RegisterModuleMethods(rpc::Agent& agent) {
  rpc::Agent* self = &agent;
  for (absl::Status s : {
           agent.HandleMethod<Self, ModuleForward>(
               [](const rpc::CallInfo&, Self m, ModuleForward f) { return m->Forward(f.input); }),
           agent.HandleMethod<Self, ModuleParameters>([self](const rpc::CallInfo&, Self m, ModuleParameters) {
             std::vector<rpc::RRef<Tensor>> out;
             for (const Tensor& p : m->Parameters()) out.push_back(self->Own(p));
             return out;
           }),
           agent.HandleMethod<Self, ModuleDescribe>(
               [](const rpc::CallInfo&, Self m, ModuleDescribe) { return m->ToString(); }),
           agent.HandleMethod<Self, ModuleState>([](const rpc::CallInfo&, Self m, ModuleState) {
             std::map<std::string, Tensor> out;
             for (auto& [name, p] : m->NamedParameters()) out.emplace(name, p);
             return out;
           }),
       }) {
    // Registered once per agent: later factories find them there.
    if (!s.ok() && s.code() != absl::StatusCode::kAlreadyExists) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<RemoteModule> RemoteModule::Created(ModuleRRef module) {
  RemoteModule m(std::move(module));
  // Waits until the factory ran: its error, or an unknown factory, surfaces here.
  if (absl::StatusOr<std::string> d = m.Describe(); !d.ok()) return d.status();
  return m;
}

absl::StatusOr<Tensor> RemoteModule::Forward(const Tensor& input, rpc::CallOptions options) const {
  return ForwardAsync(input, options).Get(module_.state()->WaitBudget(options.timeout));
}

Future<Tensor> RemoteModule::ForwardAsync(const Tensor& input, rpc::CallOptions options) const {
  return module_.Send(ModuleForward{input}, options);
}

absl::StatusOr<std::vector<rpc::RRef<Tensor>>> RemoteModule::RemoteParameters(rpc::CallOptions options) const {
  return module_.Send(ModuleParameters{}, options).Get(module_.state()->WaitBudget(options.timeout));
}

absl::StatusOr<std::map<std::string, Tensor>> RemoteModule::FetchParameters(rpc::CallOptions options) const {
  return module_.Send(ModuleState{}, options).Get(module_.state()->WaitBudget(options.timeout));
}

absl::StatusOr<std::string> RemoteModule::Describe() const {
  return module_.Send(ModuleDescribe{}).Get(module_.state()->WaitBudget(absl::ZeroDuration()));
}

}  // namespace gw::dist_nn
