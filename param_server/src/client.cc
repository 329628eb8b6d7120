#include "gradwire/param_server/client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/rpc/retry.h"
#include "gradwire/tensor/kernels.h"
#include "messages.h"

namespace gw::param_server {
namespace {

using rpc::Ack;
using namespace internal;  // the messages

}  // namespace

Client::Client(rpc::Agent& agent, std::vector<std::string> servers, int trainer, int trainers, ClientOptions options)
    : agent_(agent),
      servers_(std::move(servers)),
      trainer_(trainer),
      trainers_(trainers),
      sync_timeout_(options.sync_timeout),
      reconnect_timeout_(options.reconnect_timeout),
      last_pushes_(std::make_shared<LastPushes>()) {}

// The last push of a synchronous or bounded-staleness table to each server, kept so that
// a pull retried after the server was unavailable sends it again first: a restarted
// server may have lost an acknowledged push made after its last checkpoint, and without
// it the step would wait for this trainer forever. The server drops it if it already
// counted it ((trainer, clock) identify a push).
struct Client::LastPushes {
  absl::Mutex mu;
  std::map<std::pair<std::string, size_t>, std::function<Future<Ack>()>> push ABSL_GUARDED_BY(mu);
};

std::function<Future<Ack>()> Client::Remember(Consistency consistency, const std::string& name, size_t server,
                                              std::function<Future<Ack>()> push) const {
  if (consistency == Consistency::kAsync || reconnect_timeout_ <= absl::ZeroDuration()) return push;
  absl::MutexLock lock(&last_pushes_->mu);
  last_pushes_->push[{name, server}] = push;
  return push;
}

std::function<Future<Tensor>(int)> Client::WithPushResent(Consistency consistency, const std::string& name,
                                                          size_t server, std::function<Future<Tensor>()> pull) const {
  if (consistency == Consistency::kAsync || reconnect_timeout_ <= absl::ZeroDuration()) {
    return [pull](int) { return pull(); };
  }
  return [pushes = last_pushes_, key = std::make_pair(name, server), pull](int attempt) {
    if (attempt > 0) {
      std::function<Future<Ack>()> push;
      {
        absl::MutexLock lock(&pushes->mu);
        auto it = pushes->push.find(key);
        if (it != pushes->push.end()) push = it->second;
      }
      if (push) (void)push();  // on the same connection, ahead of the pull; the pull waits for the step anyway
    }
    return pull();
  };
}

template <typename T>
Future<T> Client::Call(std::function<Future<T>(int attempt)> call) const {
  if (reconnect_timeout_ <= absl::ZeroDuration()) return call(0);
  rpc::RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(50);
  policy.max_backoff = absl::Seconds(1);
  policy.deadline = reconnect_timeout_;
  return rpc::Retry<T>(agent_.executor(), agent_.timers(), std::move(policy), std::move(call));
}

template <typename T>
Future<T> Client::Call(std::function<Future<T>()> call) const {
  return Call<T>(std::function<Future<T>(int)>([call = std::move(call)](int) { return call(); }));
}

absl::Status Client::CreateDense(const std::string& name, const Tensor& initial, const optim::OptimizerConfig& optimizer,
                                 Consistency consistency, int64_t staleness) {
  if (!initial.defined() || initial.dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name, "': the initial value must be a float32 tensor"));
  }
  Table table{initial.sizes(), ShardDense(initial.numel(), static_cast<int>(servers_.size())), consistency};
  const Tensor flat = kernels::Reshape(kernels::Contiguous(initial), {initial.numel()});
  const TableConfig config{optimizer, consistency, trainers_, staleness, absl::ToInt64Milliseconds(sync_timeout_)};
  std::vector<Future<Ack>> created;
  for (size_t i = 0; i < servers_.size(); ++i) {
    const KeyRange& r = table.ranges[i];
    created.push_back(
        agent_.Send(servers_[i], CreateDenseMessage{name, config, kernels::Narrow(flat, 0, r.begin, r.size())}));
  }
  absl::StatusOr<std::vector<Ack>> done = WhenAll(agent_.executor(), std::move(created)).Get();
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

namespace {

// true once every push was acknowledged, else the first error (no thread hop).
Future<bool> AllAcknowledged(rpc::Executor& executor, std::vector<Future<Ack>> pushes) {
  return Map<bool>(WhenAll(executor, std::move(pushes)), [](const absl::StatusOr<std::vector<Ack>>& r) -> absl::StatusOr<bool> {
    if (!r.ok()) return r.status();
    return true;
  });
}

}  // namespace

absl::StatusOr<Client::Table> Client::FindForGradient(const std::string& name, const Tensor& grad) const {
  absl::StatusOr<Table> table = Find(name);
  if (table.ok() && grad.sizes() != table->shape) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name, "': gradient of shape ", ShapeToString(grad.sizes()),
                                                   ", table has shape ", ShapeToString(table->shape)));
  }
  return table;
}

Future<Tensor> Client::Assemble(const Table& table, std::vector<Future<Tensor>> shards) const {
  const Shape shape = table.shape;
  // Joined on the thread that completes the last shard: no hop on the way to the caller.
  return Map<Tensor>(WhenAll(agent_.executor(), std::move(shards)),
                     [shape](const absl::StatusOr<std::vector<Tensor>>& parts) -> absl::StatusOr<Tensor> {
                       if (!parts.ok()) return parts.status();
                       return JoinShards(*parts, shape);
                     });
}

Future<Tensor> Client::Pull(const std::string& name, int64_t clock) {
  absl::StatusOr<Table> table = Find(name);
  if (!table.ok()) return MakeReadyFuture<Tensor>(agent_.executor(), table.status());
  std::vector<Future<Tensor>> shards;
  for (size_t i = 0; i < servers_.size(); ++i) {
    shards.push_back(Call<Tensor>(WithPushResent(table->consistency, name, i, [agent = &agent_, server = servers_[i], name, clock,
                                                                                   timeout = sync_timeout_ * 2] {
      return agent->Send(server, PullMessage{name, clock}, rpc::CallOptions{timeout});
    })));
  }
  return Assemble(*table, std::move(shards));
}

Future<bool> Client::Push(const std::string& name, int64_t clock, const Tensor& grad) {
  absl::StatusOr<Table> table = FindForGradient(name, grad);
  if (!table.ok()) return MakeReadyFuture<bool>(agent_.executor(), table.status());
  const Tensor flat = kernels::Reshape(kernels::Contiguous(grad), {grad.numel()});
  std::vector<Future<Ack>> pushed;
  for (size_t i = 0; i < servers_.size(); ++i) {
    const KeyRange& r = table->ranges[i];
    const Tensor shard = kernels::Narrow(flat, 0, r.begin, r.size());
    pushed.push_back(Call<Ack>(Remember(table->consistency, name, i, [agent = &agent_, server = servers_[i], name, clock,
                                                                      trainer = static_cast<int64_t>(trainer_), shard] {
      return agent->Send(server, PushMessage{name, clock, trainer, shard});
    })));
  }
  return AllAcknowledged(agent_.executor(), std::move(pushed));
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


Future<std::vector<Tensor>> Client::PushPullMany(const std::vector<std::string>& names, int64_t clock,
                                                 const std::vector<Tensor>& grads) {
  if (names.size() != grads.size()) {
    return MakeReadyFuture<std::vector<Tensor>>(agent_.executor(),
                                                absl::InvalidArgumentError("PushPullMany: one gradient per table"));
  }
  std::vector<Table> tables;
  std::vector<Tensor> flat;  // each gradient as a contiguous 1-D view, once
  for (size_t t = 0; t < names.size(); ++t) {
    absl::StatusOr<Table> table = FindForGradient(names[t], grads[t]);
    if (!table.ok()) return MakeReadyFuture<std::vector<Tensor>>(agent_.executor(), table.status());
    tables.push_back(*std::move(table));
    flat.push_back(kernels::Reshape(kernels::Contiguous(grads[t]), {grads[t].numel()}));
  }
  // One message per server: every table's shard of the gradient; the answer is the list of
  // the tables' shards as of clock + 1.
  std::vector<Future<std::vector<Tensor>>> per_server;
  for (size_t i = 0; i < servers_.size(); ++i) {
    std::vector<Tensor> shards;
    for (size_t t = 0; t < names.size(); ++t) {
      const KeyRange& r = tables[t].ranges[i];
      shards.push_back(kernels::Narrow(flat[t], 0, r.begin, r.size()));
    }
    per_server.push_back(Call<std::vector<Tensor>>([agent = &agent_, server = servers_[i], names, clock,
                                                    trainer = static_cast<int64_t>(trainer_), shards,
                                                    timeout = sync_timeout_ * 2] {
      return agent->Send(server, PushPullManyMessage{names, clock, trainer, shards}, rpc::CallOptions{timeout});
    }));
  }
  return Map<std::vector<Tensor>>(
      WhenAll(agent_.executor(), std::move(per_server)),
      [tables](const absl::StatusOr<std::vector<std::vector<Tensor>>>& r) -> absl::StatusOr<std::vector<Tensor>> {
        if (!r.ok()) return r.status();
        std::vector<Tensor> out;
        for (size_t t = 0; t < tables.size(); ++t) {
          std::vector<Tensor> parts;
          for (const std::vector<Tensor>& server : *r) {
            if (t >= server.size()) return absl::DataLossError("push_pull_many: a server answered too few tables");
            parts.push_back(server[t]);
          }
          out.push_back(JoinShards(parts, tables[t].shape));
        }
        return out;
      });
}


absl::Status Client::CreateSparse(const std::string& name, int64_t dim, const SparseOptions& options,
                                  const optim::OptimizerConfig& optimizer, Consistency consistency,
                                  int64_t staleness) {
  if (dim < 1) return absl::InvalidArgumentError(absl::StrCat("sparse table '", name, "': dim must be >= 1, got ", dim));
  if (options.capacity < 0) return absl::InvalidArgumentError(absl::StrCat("sparse table '", name, "': negative capacity"));
  const TableConfig config{optimizer, consistency, trainers_, staleness, absl::ToInt64Milliseconds(sync_timeout_)};
  std::vector<Future<Ack>> created;
  for (const std::string& server : servers_) {
    created.push_back(agent_.Send(server, CreateSparseMessage{name, config, dim, options.capacity, options.init}));
  }
  absl::StatusOr<std::vector<Ack>> done = WhenAll(agent_.executor(), std::move(created)).Get();
  if (!done.ok()) return done.status();
  absl::MutexLock lock(&mu_);
  Table& table = tables_[name];
  table.consistency = consistency;
  table.sparse = true;
  table.dim = dim;
  return absl::OkStatus();
}

absl::StatusOr<Client::Table> Client::FindSparse(const std::string& name) const {
  absl::StatusOr<Table> table = Find(name);
  if (table.ok() && !table->sparse) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name, "' is dense: use Pull/Push"));
  }
  return table;
}

absl::StatusOr<int64_t> Client::RowDim(const std::string& name) const {
  absl::StatusOr<Table> table = FindSparse(name);
  if (!table.ok()) return table.status();
  return table->dim;
}

Client::Split Client::SplitIds(const Tensor& ids) const {
  const int servers = static_cast<int>(servers_.size());
  Split split;
  split.positions.resize(servers_.size());
  const Tensor c = kernels::Contiguous(ids);
  const int64_t* id = c.data<int64_t>();
  if (servers == 1) {  // no copy
    split.positions[0].resize(static_cast<size_t>(c.numel()));
    for (int64_t i = 0; i < c.numel(); ++i) split.positions[0][static_cast<size_t>(i)] = i;
    split.ids.push_back(c);
    return split;
  }
  for (int64_t i = 0; i < c.numel(); ++i) {
    split.positions[static_cast<size_t>(ServerOfId(static_cast<uint64_t>(id[i]), servers))].push_back(i);
  }
  for (const std::vector<int64_t>& pos : split.positions) {
    Tensor part = Tensor::Empty({static_cast<int64_t>(pos.size())}, DType::kInt64);
    for (size_t k = 0; k < pos.size(); ++k) part.data<int64_t>()[k] = id[pos[k]];
    split.ids.push_back(part);
  }
  return split;
}

namespace {

absl::Status CheckIds(const std::string& name, const Tensor& ids) {
  if (ids.defined() && ids.dim() == 1 && ids.dtype() == DType::kInt64) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("table '", name, "': ids must be a 1-D int64 tensor, got ",
                                                 ids.defined() ? DTypeName(ids.dtype()) : "undefined", " ",
                                                 ids.defined() ? ShapeToString(ids.sizes()) : ""));
}

}  // namespace

Future<Tensor> Client::PullRows(const std::string& name, int64_t clock, const Tensor& ids) {
  absl::StatusOr<Table> table = FindSparse(name);
  if (!table.ok()) return MakeReadyFuture<Tensor>(agent_.executor(), table.status());
  if (absl::Status s = CheckIds(name, ids); !s.ok()) return MakeReadyFuture<Tensor>(agent_.executor(), s);
  auto split = std::make_shared<Split>(SplitIds(ids));
  std::vector<Future<Tensor>> parts;
  std::vector<size_t> asked;
  // Outside kAsync every server is asked, for no rows if need be, so that a pull at
  // `clock` means step clock-1 is complete on all of them (a push for `clock` is then
  // accepted everywhere).
  const bool every_server = table->consistency != Consistency::kAsync;
  for (size_t i = 0; i < servers_.size(); ++i) {
    if (split->positions[i].empty() && !every_server) continue;
    const Tensor part = split->ids[i];
    asked.push_back(i);
    parts.push_back(Call<Tensor>(WithPushResent(table->consistency, name, i, [agent = &agent_, server = servers_[i], name, clock,
                                                                                 part, timeout = sync_timeout_ * 2] {
      return agent->Send(server, PullRowsMessage{name, clock, part}, rpc::CallOptions{timeout});
    })));
  }
  const int64_t n = ids.numel(), dim = table->dim;
  return Map<Tensor>(
      WhenAll(agent_.executor(), std::move(parts)),
      [split, asked, n, dim](const absl::StatusOr<std::vector<Tensor>>& r) -> absl::StatusOr<Tensor> {
        if (!r.ok()) return r.status();
        if (asked.size() == 1 && (*r)[0].numel() == n * dim && split->positions.size() == 1) return (*r)[0];
        Tensor out = Tensor::Empty({n, dim});
        for (size_t k = 0; k < asked.size(); ++k) {
          const std::vector<int64_t>& pos = split->positions[asked[k]];
          const Tensor rows = kernels::Contiguous((*r)[k]);
          if (rows.dim() != 2 || rows.size(0) != static_cast<int64_t>(pos.size()) || rows.size(1) != dim) {
            return absl::DataLossError("pull_rows: a server answered rows of the wrong shape");
          }
          for (size_t j = 0; j < pos.size(); ++j) {
            std::copy_n(rows.data<float>() + static_cast<int64_t>(j) * dim, dim, out.data<float>() + pos[j] * dim);
          }
        }
        return out;
      });
}

Future<bool> Client::PushRows(const std::string& name, int64_t clock, const Tensor& ids, const Tensor& grad) {
  absl::StatusOr<Table> table = FindSparse(name);
  if (!table.ok()) return MakeReadyFuture<bool>(agent_.executor(), table.status());
  if (absl::Status s = CheckIds(name, ids); !s.ok()) return MakeReadyFuture<bool>(agent_.executor(), s);
  if (!grad.defined() || grad.dtype() != DType::kFloat32 || grad.dim() != 2 || grad.size(0) != ids.numel() ||
      grad.size(1) != table->dim) {
    return MakeReadyFuture<bool>(
        agent_.executor(),
        absl::InvalidArgumentError(absl::StrCat("table '", name, "': gradient rows must be float32 [", ids.numel(), ", ",
                                                table->dim, "], got ",
                                                grad.defined() ? ShapeToString(grad.sizes()) : "undefined")));
  }
  const Split split = SplitIds(ids);
  const Tensor g = kernels::Contiguous(grad);
  const bool every_server = table->consistency != Consistency::kAsync;
  std::vector<Future<Ack>> pushed;
  for (size_t i = 0; i < servers_.size(); ++i) {
    const std::vector<int64_t>& pos = split.positions[i];
    if (pos.empty() && !every_server) continue;
    Tensor rows;
    if (servers_.size() == 1) {
      rows = g;  // no copy
    } else {
      rows = Tensor::Empty({static_cast<int64_t>(pos.size()), table->dim});
      for (size_t j = 0; j < pos.size(); ++j) {
        std::copy_n(g.data<float>() + pos[j] * table->dim, table->dim,
                    rows.data<float>() + static_cast<int64_t>(j) * table->dim);
      }
    }
    const Tensor part = split.ids[i];
    pushed.push_back(Call<Ack>(Remember(table->consistency, name, i, [agent = &agent_, server = servers_[i], name, clock,
                                                                      trainer = static_cast<int64_t>(trainer_), part, rows] {
      return agent->Send(server, PushRowsMessage{name, clock, trainer, part, rows});
    })));
  }
  return AllAcknowledged(agent_.executor(), std::move(pushed));
}

absl::StatusOr<int64_t> Client::Join(const std::string& name) {
  if (absl::StatusOr<Table> table = Find(name); !table.ok()) return table.status();
  // Ask every server where it would take this trainer (from < 0), then to take it from
  // the furthest answer; a synchronous step that started meanwhile on some server
  // answers with a later clock: ask all again with that (each round needs a step of the
  // other trainers to complete first, so a few rounds at most).
  int64_t from = -1;
  for (int round = 0; round < 1000; ++round) {
    std::vector<Future<int64_t>> answers;
    for (const std::string& server : servers_) {
      answers.push_back(Call<int64_t>([agent = &agent_, server, m = JoinTableMessage{name, trainer_, from}] {
        return agent->Send(server, m);
      }));
    }
    absl::StatusOr<std::vector<int64_t>> clocks = WhenAll(agent_.executor(), std::move(answers)).Get();
    if (!clocks.ok()) return clocks.status();
    const int64_t furthest = std::max<int64_t>(0, *std::max_element(clocks->begin(), clocks->end()));
    if (from >= 0 && furthest == from) return from;
    from = furthest;
  }
  return absl::DeadlineExceededError(absl::StrCat("trainer ", trainer_, " could not join table '", name,
                                                  "': its steps kept moving on while it asked the servers"));
}

absl::Status Client::Leave(const std::string& name, int64_t last_clock) {
  if (absl::StatusOr<Table> table = Find(name); !table.ok()) return table.status();
  std::vector<Future<Ack>> left;
  for (const std::string& server : servers_) {
    left.push_back(Call<Ack>([agent = &agent_, server, m = LeaveTableMessage{name, trainer_, last_clock}] {
      return agent->Send(server, m);
    }));
  }
  return WhenAll(agent_.executor(), std::move(left)).Get().status();
}

Future<std::vector<std::string>> Client::Checkpoint() {
  std::vector<Future<std::string>> paths;
  for (size_t i = 0; i < servers_.size(); ++i) {
    paths.push_back(Call<std::string>([agent = &agent_, server = servers_[i]] {
      return agent->Send(server, CheckpointMessage{});
    }));
  }
  return WhenAll(agent_.executor(), std::move(paths));
}

absl::StatusOr<std::vector<rpc::RRef<Tensor>>> Client::ShardRRefs(const std::string& name) {
  absl::StatusOr<Table> table = Find(name);
  if (!table.ok()) return table.status();
  if (table->sparse) return absl::InvalidArgumentError(absl::StrCat("table '", name, "' is sparse: use PullRows/PushRows"));
  std::vector<Future<rpc::RRef<Tensor>>> shards;
  for (const std::string& server : servers_) shards.push_back(agent_.Send(server, ShardRRefMessage{name}));
  return WhenAll(agent_.executor(), std::move(shards)).Get();
}

absl::StatusOr<Tensor> Client::FetchDense(const std::string& name, const std::vector<rpc::RRef<Tensor>>& shards) {
  absl::StatusOr<Table> table = Find(name);
  if (!table.ok()) return table.status();
  if (shards.size() != servers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name, "': ", shards.size(), " shard RRefs for ",
                                                   servers_.size(), " servers (use ShardRRefs)"));
  }
  std::vector<Tensor> parts;
  for (const rpc::RRef<Tensor>& shard : shards) {
    absl::StatusOr<Tensor> part = shard.ToHere();
    if (!part.ok()) return part.status();
    if (part->numel() > 0) parts.push_back(*part);
  }
  // Differentiable Cat and Reshape: the gradient flows back to each shard's owner.
  Tensor flat = parts.size() == 1 ? parts[0] : gw::Cat(parts, 0);
  if (flat.numel() != NumElements(table->shape)) {
    return absl::DataLossError(absl::StrCat("table '", name, "': shards hold ", flat.numel(), " values"));
  }
  return gw::Reshape(flat, table->shape);
}

}  // namespace gw::param_server
