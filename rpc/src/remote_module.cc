#include "gradwire/rpc/remote_module.h"

namespace gw::rpc {
namespace {

constexpr char kForward[] = "__module.forward";
constexpr char kParameters[] = "__module.parameters";
constexpr char kDescribe[] = "__module.describe";
constexpr char kState[] = "__module.state";

}  // namespace

absl::Status internal::RegisterModuleMethods(Agent& agent) {
  Agent* self = &agent;
  for (absl::Status s : {
           agent.Register(kForward,
                          [](std::shared_ptr<nn::Module> m, Tensor x) { return m->Forward(x); }),
           agent.Register(kParameters,
                          [self](std::shared_ptr<nn::Module> m) {
                            std::vector<RRef<Tensor>> out;
                            for (const Tensor& p : m->Parameters()) out.push_back(self->Own(p));
                            return out;
                          }),
           agent.Register(kDescribe, [](std::shared_ptr<nn::Module> m) { return m->ToString(); }),
           agent.Register(kState,
                          [](std::shared_ptr<nn::Module> m) {
                            std::map<std::string, Tensor> out;
                            for (auto& [name, p] : m->NamedParameters()) out.emplace(name, p);
                            return out;
                          }),
       }) {
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

absl::StatusOr<Tensor> RemoteModule::Forward(const Tensor& input, CallOptions options) const {
  return module_.Sync<Tensor>(kForward, input, options);
}

Future<Tensor> RemoteModule::ForwardAsync(const Tensor& input, CallOptions options) const {
  return module_.Async<Tensor>(kForward, input, options);
}

absl::StatusOr<std::vector<RRef<Tensor>>> RemoteModule::RemoteParameters(CallOptions options) const {
  return module_.Sync<std::vector<RRef<Tensor>>>(kParameters, options);
}

absl::StatusOr<std::map<std::string, Tensor>> RemoteModule::FetchParameters(CallOptions options) const {
  return module_.Sync<std::map<std::string, Tensor>>(kState, options);
}

absl::StatusOr<std::string> RemoteModule::Describe() const { return module_.Sync<std::string>(kDescribe); }

}  // namespace gw::rpc
