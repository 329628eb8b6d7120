#include "gradwire/dist_autograd/distributed_optimizer.h"

#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/rpc/trace.h"
#include "messages.h"
#include "optimizer_host.h"

namespace gw::dist_autograd {
namespace {

using internal::OptimizerDrop;
using internal::OptimizerRegister;
using internal::OptimizerStep;
using rpc::Ack;
using rpc::GlobalId;

// The optimizer's hyper-parameters must be in PyTorch's ranges (optim::Validate throws).
absl::Status Valid(const optim::OptimizerConfig& config) {
  return rpc::CatchExceptions("DistributedOptimizer", [&] { optim::Validate(config); });
}

// What an owner keeps for one DistributedOptimizer.
struct Hosted {
  optim::OptimizerConfig config;
  struct Param {
    rpc::RRef<Tensor> rref;  // an owner handle: keeps the parameter alive
    optim::ParamState state;
    std::unique_ptr<absl::Mutex> mu = std::make_unique<absl::Mutex>();
  };
  std::vector<Param> params;
};

class OptimizerHost {
 public:
  OptimizerHost(std::function<Tensor(GlobalId, const Tensor&)> grad_of, rpc::Tracer& tracer)
      : grad_of_(std::move(grad_of)), tracer_(tracer) {}

  absl::Status Register(OptimizerRegister m) {
    if (absl::Status s = Valid(m.config); !s.ok()) return s;
    auto hosted = std::make_shared<Hosted>();
    hosted->config = m.config;
    for (rpc::RRef<Tensor>& p : m.params) {
      if (!p.IsOwner()) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter RRef #", p.id().ToString(), " is owned by ", p.Owner(), ", not by this worker"));
      }
      Hosted::Param param;
      param.rref = std::move(p);
      hosted->params.push_back(std::move(param));
    }
    absl::MutexLock lock(&mu_);
    hosted_[m.optimizer] = std::move(hosted);
    return absl::OkStatus();
  }

  absl::Status Step(const OptimizerStep& m) {
    std::shared_ptr<Hosted> hosted;
    {
      absl::MutexLock lock(&mu_);
      auto it = hosted_.find(m.optimizer);
      if (it == hosted_.end()) {
        return absl::NotFoundError(absl::StrCat("no DistributedOptimizer #", m.optimizer.ToString(), " here"));
      }
      hosted = it->second;
    }
    rpc::Tracer::Scope span(tracer_, tracer_.Intern("dist_autograd"), tracer_.Intern("optimizer step"));
    span.span().context = m.context.bits();
    for (Hosted::Param& p : hosted->params) {
      absl::StatusOr<Tensor> param = p.rref.LocalValue();
      if (!param.ok()) return param.status();
      Tensor grad = grad_of_(m.context, *param);
      if (!grad.defined()) continue;  // no gradient in this context
      absl::MutexLock lock(p.mu.get());
      // A gradient of the wrong shape throws gw::Error: the dispatcher turns it into
      // INVALID_ARGUMENT naming the optimizer and both shapes.
      optim::Update(hosted->config, *param, grad, p.state);
    }
    return absl::OkStatus();
  }

  void Drop(const OptimizerDrop& m) {
    std::shared_ptr<Hosted> dropped;
    absl::MutexLock lock(&mu_);
    auto it = hosted_.find(m.optimizer);
    if (it == hosted_.end()) return;
    dropped = std::move(it->second);  // released after the lock
    hosted_.erase(it);
  }

 private:
  const std::function<Tensor(GlobalId, const Tensor&)> grad_of_;
  rpc::Tracer& tracer_;
  absl::Mutex mu_;
  absl::flat_hash_map<GlobalId, std::shared_ptr<Hosted>> hosted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status InstallOptimizerHost(rpc::Agent& agent, std::function<Tensor(GlobalId, const Tensor&)> grad_of) {
  auto host = std::make_shared<OptimizerHost>(std::move(grad_of), agent.tracer());
  for (absl::Status s : {
           agent.Handle<OptimizerRegister>(
               [host](const rpc::CallInfo&, OptimizerRegister m) { return host->Register(std::move(m)); }),
           agent.Handle<OptimizerStep>([host](const rpc::CallInfo&, const OptimizerStep& m) { return host->Step(m); }),
           agent.Handle<OptimizerDrop>([host](const rpc::CallInfo&, const OptimizerDrop& m) {
             host->Drop(m);
             return absl::OkStatus();
           }),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    rpc::Agent& agent, optim::OptimizerConfig config, std::vector<rpc::RRef<Tensor>> params) {
  if (absl::Status s = Valid(config); !s.ok()) return s;
  const GlobalId id = agent.NewId();
  std::map<std::string, std::vector<rpc::RRef<Tensor>>> by_owner;
  for (rpc::RRef<Tensor>& p : params) {
    if (!p.valid()) return absl::InvalidArgumentError("DistributedOptimizer: a parameter RRef is null");
    by_owner[p.Owner()].push_back(std::move(p));
  }
  std::vector<Future<Ack>> registered;
  std::vector<std::string> owners;
  for (auto& [owner, ps] : by_owner) {
    owners.push_back(owner);
    registered.push_back(agent.Send(owner, OptimizerRegister{id, config, std::move(ps)}));
  }
  for (size_t i = 0; i < registered.size(); ++i) {
    absl::StatusOr<Ack> r = registered[i].Get();
    if (!r.ok()) {
      return absl::Status(r.status().code(), absl::StrCat("DistributedOptimizer: registering parameters on ", owners[i],
                                                          ": ", r.status().message()));
    }
  }
  return std::unique_ptr<DistributedOptimizer>(new DistributedOptimizer(agent, id, std::move(owners)));
}

DistributedOptimizer::~DistributedOptimizer() {
  for (const std::string& owner : owners_) (void)agent_.Send(owner, OptimizerDrop{id_});
}

absl::Status DistributedOptimizer::Step(GlobalId context_id) {
  rpc::Tracer& tracer = agent_.tracer();
  rpc::Tracer::Scope span(tracer, tracer.Intern("dist_autograd"), tracer.Intern("optimizer step"));
  span.span().context = context_id.bits();
  std::vector<Future<Ack>> steps;
  for (const std::string& owner : owners_) steps.push_back(agent_.Send(owner, OptimizerStep{id_, context_id}));
  absl::Status first;
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StatusOr<Ack> r = steps[i].Get();
    if (!r.ok() && first.ok()) {
      first = absl::Status(r.status().code(),
                           absl::StrCat("DistributedOptimizer step on ", owners_[i], ": ", r.status().message()));
    }
  }
  return first;
}

}  // namespace gw::dist_autograd
