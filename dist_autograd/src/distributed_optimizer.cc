#include "gradwire/dist_autograd/distributed_optimizer.h"

#include <atomic>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/tensor/error.h"
#include "optimizer_host.h"

namespace gw::dist_autograd {
namespace {

using rpc::Value;
using rpc::ValueList;
using rpc::ValueMap;

constexpr char kRegisterFn[] = "__dist.opt_register";
constexpr char kStepFn[] = "__dist.opt_step";
constexpr char kDropFn[] = "__dist.opt_drop";

// Calls f(name, field) for every hyper-parameter of a config.
template <typename F>
void ForFields(optim::Sgd& c, F f) {
  f("lr", c.lr), f("momentum", c.momentum), f("dampening", c.dampening), f("weight_decay", c.weight_decay);
  f("nesterov", c.nesterov), f("maximize", c.maximize);
}
template <typename F>
void ForFields(optim::Adam& c, F f) {
  f("lr", c.lr), f("beta1", c.beta1), f("beta2", c.beta2), f("eps", c.eps), f("weight_decay", c.weight_decay);
  f("amsgrad", c.amsgrad), f("maximize", c.maximize);
}
template <typename F>
void ForFields(optim::AdamW& c, F f) {
  f("lr", c.lr), f("beta1", c.beta1), f("beta2", c.beta2), f("eps", c.eps), f("weight_decay", c.weight_decay);
  f("amsgrad", c.amsgrad), f("maximize", c.maximize);
}
template <typename F>
void ForFields(optim::Adagrad& c, F f) {
  f("lr", c.lr), f("lr_decay", c.lr_decay), f("weight_decay", c.weight_decay);
  f("initial_accumulator_value", c.initial_accumulator_value), f("eps", c.eps), f("maximize", c.maximize);
}

template <typename C>
absl::StatusOr<optim::OptimizerConfig> Read(const ValueMap& m) {
  C c;
  absl::Status status;
  ForFields(c, [&](const char* name, auto& field) {
    auto it = m.find(name);
    if (it == m.end()) return;  // default
    using T = std::decay_t<decltype(field)>;
    absl::StatusOr<T> v = rpc::ValueTraits<T>::From(it->second);
    if (!v.ok() && status.ok()) status = absl::InvalidArgumentError(absl::StrCat("optimizer field ", name, ": ", v.status().message()));
    if (v.ok()) field = *v;
  });
  if (!status.ok()) return status;
  return optim::OptimizerConfig(c);
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
  explicit OptimizerHost(std::function<Tensor(uint64_t, const Tensor&)> grad_of) : grad_of_(std::move(grad_of)) {}

  absl::Status Register(uint64_t id, const Value& config, std::vector<rpc::RRef<Tensor>> params) {
    absl::StatusOr<optim::OptimizerConfig> c = ConfigFromValue(config);
    if (!c.ok()) return c.status();
    try {
      optim::Validate(*c);
    } catch (const gw::Error& e) {
      return absl::InvalidArgumentError(e.what());
    }
    auto hosted = std::make_shared<Hosted>();
    hosted->config = *c;
    for (rpc::RRef<Tensor>& p : params) {
      if (!p.IsOwner()) {
        return absl::InvalidArgumentError(absl::StrCat("parameter RRef #", p.id().ToString(), " is owned by ", p.Owner(),
                                                       ", not by this worker"));
      }
      Hosted::Param param;
      param.rref = std::move(p);
      hosted->params.push_back(std::move(param));
    }
    absl::MutexLock lock(&mu_);
    hosted_[id] = std::move(hosted);
    return absl::OkStatus();
  }

  absl::Status Step(uint64_t id, uint64_t context_id) {
    std::shared_ptr<Hosted> hosted;
    {
      absl::MutexLock lock(&mu_);
      auto it = hosted_.find(id);
      if (it == hosted_.end()) return absl::NotFoundError(absl::StrCat("no DistributedOptimizer #", id, " here"));
      hosted = it->second;
    }
    for (Hosted::Param& p : hosted->params) {
      absl::StatusOr<Tensor> param = p.rref.LocalValue();
      if (!param.ok()) return param.status();
      Tensor grad = grad_of_(context_id, *param);
      if (!grad.defined()) continue;  // no gradient in this context
      absl::MutexLock lock(p.mu.get());
      try {
        optim::Update(hosted->config, *param, grad, p.state);
      } catch (const gw::Error& e) {
        return absl::InvalidArgumentError(e.what());
      }
    }
    return absl::OkStatus();
  }

  void Drop(uint64_t id) {
    std::shared_ptr<Hosted> dropped;
    absl::MutexLock lock(&mu_);
    auto it = hosted_.find(id);
    if (it == hosted_.end()) return;
    dropped = std::move(it->second);  // released after the lock
    hosted_.erase(it);
  }

 private:
  const std::function<Tensor(uint64_t, const Tensor&)> grad_of_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Hosted>> hosted_ ABSL_GUARDED_BY(mu_);
};

std::atomic<uint64_t> next_optimizer{1};

}  // namespace

Value ConfigToValue(const optim::OptimizerConfig& config) {
  ValueMap m;
  m["name"] = Value(optim::Name(config));
  std::visit(
      [&](auto c) {
        ForFields(c, [&](const char* name, auto& field) { m[name] = Value(field); });
      },
      config);
  return Value(std::move(m));
}

absl::StatusOr<optim::OptimizerConfig> ConfigFromValue(const Value& v) {
  if (!v.is<ValueMap>()) return absl::InvalidArgumentError("optimizer config: expected a map");
  const ValueMap& m = v.get<ValueMap>();
  auto name = m.find("name");
  if (name == m.end() || !name->second.is<std::string>()) return absl::InvalidArgumentError("optimizer config: no name");
  const std::string& n = name->second.get<std::string>();
  if (n == "SGD") return Read<optim::Sgd>(m);
  if (n == "Adam") return Read<optim::Adam>(m);
  if (n == "AdamW") return Read<optim::AdamW>(m);
  if (n == "Adagrad") return Read<optim::Adagrad>(m);
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer '", n, "'"));
}

absl::Status InstallOptimizerHost(rpc::Agent& agent, std::function<Tensor(uint64_t, const Tensor&)> grad_of) {
  auto host = std::make_shared<OptimizerHost>(std::move(grad_of));
  for (absl::Status s : {
           agent.Register(kRegisterFn,
                          [host](int64_t id, Value config, std::vector<rpc::RRef<Tensor>> params) {
                            return host->Register(static_cast<uint64_t>(id), config, std::move(params));
                          }),
           agent.Register(kStepFn,
                          [host](int64_t id, int64_t context_id) {
                            return host->Step(static_cast<uint64_t>(id), static_cast<uint64_t>(context_id));
                          }),
           agent.Register(kDropFn, [host](int64_t id) { host->Drop(static_cast<uint64_t>(id)); }),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(rpc::Agent& agent,
                                                                                   optim::OptimizerConfig config,
                                                                                   std::vector<rpc::RRef<Tensor>> params) {
  try {
    optim::Validate(config);
  } catch (const gw::Error& e) {
    return absl::InvalidArgumentError(e.what());
  }
  const uint64_t id = (static_cast<uint64_t>(agent.self().rank) << 48) | next_optimizer.fetch_add(1);
  std::map<std::string, std::vector<rpc::RRef<Tensor>>> by_owner;
  for (rpc::RRef<Tensor>& p : params) {
    if (!p.valid()) return absl::InvalidArgumentError("DistributedOptimizer: a parameter RRef is null");
    by_owner[p.Owner()].push_back(std::move(p));
  }
  std::vector<Future<Value>> registered;
  std::vector<std::string> owners;
  for (auto& [owner, ps] : by_owner) {
    owners.push_back(owner);
    registered.push_back(agent.Async<Value>(owner, kRegisterFn, static_cast<int64_t>(id), ConfigToValue(config), ps));
  }
  for (size_t i = 0; i < registered.size(); ++i) {
    absl::StatusOr<Value> r = registered[i].Get();
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("DistributedOptimizer: registering parameters on ", owners[i], ": ",
                                       r.status().message()));
    }
  }
  return std::unique_ptr<DistributedOptimizer>(new DistributedOptimizer(agent, id, std::move(owners)));
}

DistributedOptimizer::~DistributedOptimizer() {
  for (const std::string& owner : owners_) (void)agent_.Async<Value>(owner, kDropFn, static_cast<int64_t>(id_));
}

absl::Status DistributedOptimizer::Step(uint64_t context_id) {
  std::vector<Future<Value>> steps;
  for (const std::string& owner : owners_) {
    steps.push_back(agent_.Async<Value>(owner, kStepFn, static_cast<int64_t>(id_), static_cast<int64_t>(context_id)));
  }
  absl::Status first;
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StatusOr<Value> r = steps[i].Get();
    if (!r.ok() && first.ok()) {
      first = absl::Status(r.status().code(),
                           absl::StrCat("DistributedOptimizer step on ", owners_[i], ": ", r.status().message()));
    }
  }
  return first;
}

}  // namespace gw::dist_autograd
