#include "gradwire/dist_nn/remote_module.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

absl::StatusOr<RemoteModule> RemoteModule::Created(ModuleRRef module, const std::string& worker,
                                                   const std::string& factory) {
  RemoteModule m(std::move(module));
  // Waits until the factory ran: its error, or an unknown factory, surfaces here.
  absl::StatusOr<std::string> d = m.Describe();
  if (d.ok()) return m;
  // The rpc layer says "<worker> has no function '<factory>' (registered: ...)": the
  // factory is what is missing, in the words of this layer.
  const absl::string_view why = d.status().message();
  if (!absl::IsNotFound(d.status()) || !absl::StrContains(why, absl::StrCat("has no function '", factory, "'"))) {
    return d.status();
  }
  std::string registered = "none";
  if (const size_t at = why.find("(registered: "); at != absl::string_view::npos) {
    const size_t from = at + sizeof("(registered: ") - 1;
    const size_t to = why.rfind(')');
    if (to != absl::string_view::npos && to > from) registered = std::string(why.substr(from, to - from));
  }
  return absl::NotFoundError(absl::StrCat(worker, " has no module factory '", factory,
                                          "' (register it with dist_nn::RegisterModuleFactory in that worker's "
                                          "Agent::Start setup; functions registered there: ",
                                          registered, ")"));
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
