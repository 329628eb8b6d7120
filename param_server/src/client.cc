#include "gradwire/param_server/client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gradwire/tensor/kernels.h"
#include "wire.h"

namespace gw::param_server {
namespace {

using rpc::Value;

}  // namespace

Client::Client(rpc::Agent& agent, std::vector<std::string> servers, int trainer, int trainers,
               absl::Duration sync_timeout)
    : agent_(agent), servers_(std::move(servers)), trainer_(trainer), trainers_(trainers), sync_timeout_(sync_timeout) {}

absl::Status Client::CreateDense(const std::string& name, const Tensor& initial, const optim::OptimizerConfig& optimizer,
                                 Consistency consistency, int64_t staleness) {
  if (!initial.defined() || initial.dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name, "': the initial value must be a float32 tensor"));
  }
  Table table{initial.sizes(), ShardDense(initial.numel(), static_cast<int>(servers_.size())), consistency};
  const Tensor flat = kernels::Reshape(kernels::Contiguous(initial), {initial.numel()});
  std::vector<Future<Value>> created;
  for (size_t i = 0; i < servers_.size(); ++i) {
    const KeyRange& r = table.ranges[i];
    created.push_back(agent_.Async<Value>(servers_[i], kCreateFn, name, kernels::Narrow(flat, 0, r.begin, r.size()),
                                          ConfigToValue(optimizer), static_cast<int64_t>(consistency),
                                          static_cast<int64_t>(trainers_),
                                          absl::ToInt64Milliseconds(sync_timeout_), staleness));
  }
  absl::StatusOr<std::vector<Value>> done = WhenAll(agent_.executor(), std::move(created)).Get();
  if (!done.ok()) return done.status();
  absl::MutexLock lock(&mu_);
  tables_[name] = std::move(table);
  return absl::OkStatus();
}

absl::StatusOr<Client::Table> Client::Find(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", name, "' is not known to this client (CreateDense it first)"));
  }
  return it->second;
}

Future<Tensor> Client::Assemble(const Table& table, std::vector<Future<Tensor>> shards) const {
  const Shape shape = table.shape;
  return WhenAll(agent_.executor(), std::move(shards))
      .Then([shape](const absl::StatusOr<std::vector<Tensor>>& parts) -> absl::StatusOr<Tensor> {
        if (!parts.ok()) return parts.status();
        std::vector<Tensor> nonempty;
        for (const Tensor& p : *parts) {
          if (p.numel() > 0) nonempty.push_back(p);
        }
        Tensor flat = nonempty.size() == 1 ? nonempty[0] : kernels::Cat(nonempty, 0);
        return kernels::Reshape(flat, shape);
      });
}

Future<Tensor> Client::Pull(const std::string& name, int64_t clock) {
  absl::StatusOr<Table> table = Find(name);
  if (!table.ok()) return MakeReadyFuture<Tensor>(agent_.executor(), table.status());
  std::vector<Future<Tensor>> shards;
  for (size_t i = 0; i < servers_.size(); ++i) {
    shards.push_back(agent_.Async<Tensor>(servers_[i], kPullFn, name, clock, rpc::CallOptions{sync_timeout_ * 2}));
  }
  return Assemble(*table, std::move(shards));
}

Future<bool> Client::Push(const std::string& name, int64_t clock, const Tensor& grad) {
  absl::StatusOr<Table> table = Find(name);
  if (!table.ok()) return MakeReadyFuture<bool>(agent_.executor(), table.status());
  if (grad.sizes() != table->shape) {
    return MakeReadyFuture<bool>(
        agent_.executor(), absl::InvalidArgumentError(absl::StrCat("table '", name, "': gradient of shape ",
                                                                   ShapeToString(grad.sizes()), ", table has shape ",
                                                                   ShapeToString(table->shape))));
  }
  const Tensor flat = kernels::Reshape(kernels::Contiguous(grad), {grad.numel()});
  std::vector<Future<Value>> pushed;
  for (size_t i = 0; i < servers_.size(); ++i) {
    const KeyRange& r = table->ranges[i];
    pushed.push_back(agent_.Async<Value>(servers_[i], kPushFn, name, clock, static_cast<int64_t>(trainer_),
                                         kernels::Narrow(flat, 0, r.begin, r.size())));
  }
  return WhenAll(agent_.executor(), std::move(pushed)).Then([](const absl::StatusOr<std::vector<Value>>& r) -> absl::StatusOr<bool> {
    if (!r.ok()) return r.status();
    return true;
  });
}

Future<Tensor> Client::PushPull(const std::string& name, int64_t clock, const Tensor& grad) {
  absl::StatusOr<Table> table = Find(name);
  if (!table.ok()) return MakeReadyFuture<Tensor>(agent_.executor(), table.status());
  Future<bool> pushed = Push(name, clock, grad);
  if (table->consistency == Consistency::kSync) {
    // The pull of the next step waits on the server for every trainer's push: it may
    // travel right behind ours.
    Future<Tensor> pulled = Pull(name, clock + 1);
    return pushed.Then([pulled](const absl::StatusOr<bool>& p) -> Future<Tensor> {
      if (!p.ok()) return MakeReadyFuture<Tensor>(*pulled.executor(), p.status());
      return pulled;
    });
  }
  // Otherwise a pull is served at once, and the server may run it before our push (its
  // handlers run concurrently): pull only once the push is acknowledged.
  return pushed.Then([this, name, clock](const absl::StatusOr<bool>& p) -> Future<Tensor> {
    if (!p.ok()) return MakeReadyFuture<Tensor>(agent_.executor(), p.status());
    return Pull(name, clock + 1);
  });
}

}  // namespace gw::param_server

namespace gw::param_server {

Future<std::vector<Tensor>> Client::PushPullMany(const std::vector<std::string>& names, int64_t clock,
                                                 const std::vector<Tensor>& grads) {
  if (names.size() != grads.size()) {
    return MakeReadyFuture<std::vector<Tensor>>(agent_.executor(),
                                                absl::InvalidArgumentError("PushPullMany: one gradient per table"));
  }
  std::vector<Table> tables;
  for (size_t t = 0; t < names.size(); ++t) {
    absl::StatusOr<Table> table = Find(names[t]);
    if (!table.ok()) return MakeReadyFuture<std::vector<Tensor>>(agent_.executor(), table.status());
    if (grads[t].sizes() != table->shape) {
      return MakeReadyFuture<std::vector<Tensor>>(
          agent_.executor(), absl::InvalidArgumentError(absl::StrCat("table '", names[t], "': gradient of shape ",
                                                                     ShapeToString(grads[t].sizes()), ", table has shape ",
                                                                     ShapeToString(table->shape))));
    }
    tables.push_back(*std::move(table));
  }
  // One message per server: every table's shard of the gradient; the answer is the list of
  // the tables' shards as of clock + 1.
  std::vector<Future<std::vector<Tensor>>> per_server;
  for (size_t i = 0; i < servers_.size(); ++i) {
    std::vector<Tensor> shards;
    for (size_t t = 0; t < names.size(); ++t) {
      const KeyRange& r = tables[t].ranges[i];
      shards.push_back(kernels::Narrow(kernels::Reshape(kernels::Contiguous(grads[t]), {grads[t].numel()}), 0, r.begin,
                                       r.size()));
    }
    per_server.push_back(agent_.Async<std::vector<Tensor>>(servers_[i], kPushPullManyFn, names, clock,
                                                            static_cast<int64_t>(trainer_), shards,
                                                            rpc::CallOptions{sync_timeout_ * 2}));
  }
  return WhenAll(agent_.executor(), std::move(per_server))
      .Then([tables](const absl::StatusOr<std::vector<std::vector<Tensor>>>& r) -> absl::StatusOr<std::vector<Tensor>> {
        if (!r.ok()) return r.status();
        std::vector<Tensor> out;
        for (size_t t = 0; t < tables.size(); ++t) {
          std::vector<Tensor> parts;
          for (const std::vector<Tensor>& server : *r) {
            if (t >= server.size()) return absl::DataLossError("push_pull_many: a server answered too few tables");
            if (server[t].numel() > 0) parts.push_back(server[t]);
          }
          Tensor flat = parts.size() == 1 ? parts[0] : kernels::Cat(parts, 0);
          out.push_back(kernels::Reshape(flat, tables[t].shape));
        }
        return out;
      });
}

}  // namespace gw::param_server
