#include "gradwire/param_server/client.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpointer.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/rpc/retry.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/rpc/traced_future.h"
#include "gradwire/rpc/waits.h"
#include "gradwire/tensor/kernels.h"
#include "messages.h"
#include "resplit.h"

namespace gw::param_server {
namespace {

using rpc::Ack;
using namespace internal;  // the messages

}  // namespace

struct Client::Progress {
  std::atomic<uint64_t> pushes{0};
  std::atomic<int64_t> last_clock{0};
  std::atomic<int64_t> last_push_ns{0};  // Unix time
};

Client::Client(rpc::Agent& agent, std::vector<std::string> servers, int trainer, int trainers, ClientOptions options)
    : agent_(agent),
      servers_(std::move(servers)),
      trainer_(trainer),
      trainers_(trainers),
      sync_timeout_(options.sync_timeout),
      reconnect_timeout_(options.reconnect_timeout),
      last_pushes_(std::make_shared<LastPushes>()),
      checkpoint_every_(options.checkpoint_every),
      checkpointer_(
          std::make_shared<internal::Checkpointer>(agent, options.checkpoint_max_failures, options.sync_timeout)),
      next_checkpoint_(absl::Now() + options.checkpoint_every),
      progress_(std::make_shared<Progress>()) {
  rpc::Statistics::Source statistics =
      agent_.statistics().Add("ps_client", [p = progress_, trainer = trainer_](std::vector<rpc::Sample>& out) {
        const std::map<std::string, std::string> labels = {{"trainer", absl::StrCat(trainer)}};
        out.push_back({"gradwire_ps_client_pushes_total", labels, static_cast<double>(p->pushes.load())});
        out.push_back({"gradwire_ps_client_last_clock", labels, static_cast<double>(p->last_clock.load())});
        out.push_back(
            {"gradwire_ps_client_last_push_time_seconds", labels, static_cast<double>(p->last_push_ns.load()) * 1e-9});
      });
  // The trainer's last completed push, for `gradwire debug` (a trainer stuck in its own
  // code shows how long ago it last pushed).
  rpc::Waits::Source waits =
      agent_.waits().Add("ps_client", [p = progress_, trainer = trainer_](std::vector<rpc::Wait>& out) {
        const int64_t last_ns = p->last_push_ns.load();
        if (last_ns == 0) {
          out.push_back({.layer = "param_server",
                         .state = "last",
                         .what = absl::StrCat("trainer ", trainer, ": no push yet"),
                         .seconds = -1});
          return;
        }
        out.push_back({.layer = "param_server",
                       .state = "last",
                       .what = absl::StrCat("trainer ", trainer, "'s push of clock ", p->last_clock.load()),
                       .seconds = absl::ToDoubleSeconds(absl::Now() - absl::FromUnixNanos(last_ns)),
                       .note = absl::StrCat(p->pushes.load(), p->pushes.load() == 1 ? " push" : " pushes")});
      });
  // Both sources go with the client's one handle.
  statistics_ =
      std::make_shared<std::pair<rpc::Statistics::Source, rpc::Waits::Source>>(std::move(statistics), std::move(waits));
}

Client::~Client() = default;

namespace {

// A push, pull or checkpoint as an async span of the trace, from start() (which sends its
// calls) to its result; `clock` is its argument.
template <typename T>
Future<T> Traced(rpc::Agent& agent, const std::string& what, const std::string& table, int64_t clock,
                 const std::function<Future<T>()>& start) {
  rpc::Tracer& tracer = agent.tracer();
  if (!tracer.enabled()) return start();
  return rpc::TracedUntilReady<T>(tracer,
                                  {.category = tracer.Intern("param_server"),
                                   .name = tracer.Intern(table.empty() ? what : absl::StrCat(what, " ", table)),
                                   .arg_names = {clock >= 0 ? tracer.Intern("clock") : rpc::Tracer::Name{0}, 0},
                                   .arg_values = {clock, 0}},
                                  start);
}

}  // namespace

template <typename T>
Future<T> Client::CountPush(int64_t clock, Future<T> pushed) const {
  // The result is handed on after it is counted: whoever sees the push done sees it counted.
  return Map<T>(pushed, [progress = progress_, clock](const absl::StatusOr<T>& r) -> absl::StatusOr<T> {
    if (r.ok()) {
      progress->pushes.fetch_add(1, std::memory_order_relaxed);
      progress->last_clock.store(clock, std::memory_order_relaxed);
      progress->last_push_ns.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
    }
    return r;
  });
}

// The last push of a synchronous or bounded-staleness table to each server, kept so that
// a pull retried after the server was unavailable sends it again first: a restarted
// server may have lost an acknowledged push made after its last checkpoint, and without
// it the step would wait for this trainer forever. The server drops it if it already
// counted it ((trainer, clock) identify a push).
struct Client::LastPushes {
  absl::Mutex mu;
  std::map<std::pair<std::string, std::string>, std::function<Future<Ack>()>> push ABSL_GUARDED_BY(mu);  // (table, server)
};

std::function<Future<Ack>()> Client::Remember(Consistency consistency, const std::string& name, const std::string& server,
                                              std::function<Future<Ack>()> push) const {
  if (consistency == Consistency::kAsync || reconnect_timeout_ <= absl::ZeroDuration()) return push;
  absl::MutexLock lock(&last_pushes_->mu);
  last_pushes_->push[{name, server}] = push;
  return push;
}

std::function<Future<Tensor>(int)> Client::WithPushResent(Consistency consistency, const std::string& name,
                                                          const std::string& server,
                                                          std::function<Future<Tensor>()> pull) const {
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

// ---------------------------------------------------------------- layouts

std::string Client::LayoutKey(const std::string& name) const {
  return absl::StrCat(agent_.options().run_id, "/ps/layout/", name);
}

void Client::Place(Table& table, std::vector<std::string> servers, int64_t epoch) {
  table.servers = std::move(servers);
  table.epoch = epoch;
  if (table.sparse) {
    table.placement = std::make_shared<const IdPlacement>(table.servers);
  } else {
    table.ranges = ShardDense(NumElements(table.shape), static_cast<int>(table.servers.size()));
  }
}

absl::StatusOr<Client::Layout> Client::ReadLayout(const std::string& name) const {
  absl::StatusOr<std::string> record = agent_.store().Get(LayoutKey(name), absl::Milliseconds(1));
  if (!record.ok()) {
    // A missing key (the wait for it timed out): never re-sharded. Anything else (the
    // store unreachable) must not be taken for that.
    if (record.status().code() == absl::StatusCode::kDeadlineExceeded ||
        record.status().code() == absl::StatusCode::kNotFound) {
      return Layout{servers_, 0};
    }
    return absl::Status(record.status().code(),
                        absl::StrCat("cannot read the layout of table '", name, "': ", record.status().message()));
  }
  Layout layout;
  std::vector<std::string> parts = absl::StrSplit(*record, ' ');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &layout.epoch)) {
    return absl::DataLossError(absl::StrCat("bad layout record of table '", name, "' in the store: ", *record));
  }
  layout.servers = absl::StrSplit(parts[1], ',');
  return layout;
}

absl::StatusOr<Client::Table> Client::Refreshed(const std::string& name) {
  absl::StatusOr<Layout> layout = ReadLayout(name);
  if (!layout.ok()) return layout.status();
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) return NotKnown(name);
  if (layout->epoch > it->second.epoch) Place(it->second, layout->servers, layout->epoch);
  return it->second;
}

template <typename T>
Future<T> Client::OnLayout(const std::string& name, std::function<Future<T>(const Table&)> op) {
  absl::StatusOr<Table> table = Find(name);
  if (!table.ok()) return MakeReadyFuture<T>(agent_.executor(), table.status());
  // A table being re-sharded refuses with ABORTED: once its new layout is in the store
  // the request goes out again, split by it (on a pool thread: reading the store blocks).
  rpc::RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(10);
  policy.max_backoff = absl::Milliseconds(500);
  policy.deadline = sync_timeout_;
  policy.retryable = [](const absl::Status& s) { return s.code() == absl::StatusCode::kAborted; };
  return rpc::Retry<T>(agent_.executor(), agent_.timers(), std::move(policy),
                       [this, name, op, first = *std::move(table)](int attempt) {
                         if (attempt == 0) return op(first);
                         absl::StatusOr<Table> now = Refreshed(name);
                         if (!now.ok()) return MakeReadyFuture<T>(agent_.executor(), now.status());
                         return op(*now);
                       });
}

absl::Status Client::NotKnown(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("table '", name, "' is not known to this client (CreateDense it first)"));
}

// ---------------------------------------------------------------- tables

absl::Status Client::CreateDense(const std::string& name, const Tensor& initial, const optim::OptimizerConfig& optimizer,
                                 Consistency consistency, int64_t staleness) {
  if (!initial.defined() || initial.dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name, "': the initial value must be a float32 tensor"));
  }
  absl::StatusOr<Layout> layout = ReadLayout(name);
  if (!layout.ok()) return layout.status();
  Table table;
  table.shape = initial.sizes();
  table.consistency = consistency;
  Place(table, layout->servers, layout->epoch);
  if (layout->epoch == 0) {  // a re-sharded table exists already: it is only looked up
    const Tensor flat = kernels::Reshape(kernels::Contiguous(initial), {initial.numel()});
    const TableConfig config{optimizer, consistency, trainers_, staleness, absl::ToInt64Milliseconds(sync_timeout_)};
    std::vector<Future<Ack>> created;
    for (size_t i = 0; i < table.servers.size(); ++i) {
      const KeyRange& r = table.ranges[i];
      created.push_back(agent_.Send(table.servers[i],
                                    CreateDenseMessage{name, config, kernels::Narrow(flat, 0, r.begin, r.size())}));
    }
    absl::StatusOr<std::vector<Ack>> done = WhenAll(agent_.executor(), std::move(created)).Get();
    if (!done.ok()) return done.status();
  }
  absl::MutexLock lock(&mu_);
  tables_[name] = std::move(table);
  return absl::OkStatus();
}

absl::Status Client::CreateSparse(const std::string& name, int64_t dim, const SparseOptions& options,
                                  const optim::OptimizerConfig& optimizer, Consistency consistency,
                                  int64_t staleness) {
  if (dim < 1) return absl::InvalidArgumentError(absl::StrCat("sparse table '", name, "': dim must be >= 1, got ", dim));
  if (options.capacity < 0) return absl::InvalidArgumentError(absl::StrCat("sparse table '", name, "': negative capacity"));
  absl::StatusOr<Layout> layout = ReadLayout(name);
  if (!layout.ok()) return layout.status();
  Table table;
  table.consistency = consistency;
  table.sparse = true;
  table.dim = dim;
  Place(table, layout->servers, layout->epoch);
  if (layout->epoch == 0) {
    const TableConfig config{optimizer, consistency, trainers_, staleness, absl::ToInt64Milliseconds(sync_timeout_)};
    std::vector<Future<Ack>> created;
    for (const std::string& server : table.servers) {
      created.push_back(agent_.Send(server, CreateSparseMessage{name, config, dim, options.capacity, options.init}));
    }
    absl::StatusOr<std::vector<Ack>> done = WhenAll(agent_.executor(), std::move(created)).Get();
    if (!done.ok()) return done.status();
  }
  absl::MutexLock lock(&mu_);
  tables_[name] = std::move(table);
  return absl::OkStatus();
}

absl::StatusOr<Client::Table> Client::Find(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) return NotKnown(name);
  return it->second;
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

namespace {

// true once every push was acknowledged, else the first error (no thread hop).
Future<bool> AllAcknowledged(rpc::Executor& executor, std::vector<Future<Ack>> pushes) {
  return Map<bool>(WhenAll(executor, std::move(pushes)), [](const absl::StatusOr<std::vector<Ack>>& r) -> absl::StatusOr<bool> {
    if (!r.ok()) return r.status();
    return true;
  });
}

absl::Status CheckIds(const std::string& name, const Tensor& ids) {
  if (ids.defined() && ids.dim() == 1 && ids.dtype() == DType::kInt64) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("table '", name, "': ids must be a 1-D int64 tensor, got ",
                                                 ids.defined() ? DTypeName(ids.dtype()) : "undefined", " ",
                                                 ids.defined() ? ShapeToString(ids.sizes()) : ""));
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

// ---------------------------------------------------------------- dense

Future<Tensor> Client::Pull(const std::string& name, int64_t clock) {
  return Traced<Tensor>(agent_, "pull", name, clock, [&] {
    return OnLayout<Tensor>(name, [this, name, clock](const Table& t) { return PullOn(t, name, clock); });
  });
}

Future<Tensor> Client::PullOn(const Table& table, const std::string& name, int64_t clock) const {
  std::vector<Future<Tensor>> shards;
  for (const std::string& server : table.servers) {
    shards.push_back(Call<Tensor>(WithPushResent(table.consistency, name, server,
                                                 [agent = &agent_, server, name, clock, epoch = table.epoch,
                                                  timeout = sync_timeout_ * 2] {
                                                   return agent->Send(server, PullMessage{name, clock, epoch},
                                                                      rpc::CallOptions{timeout});
                                                 })));
  }
  return Assemble(table, std::move(shards));
}

Future<bool> Client::Push(const std::string& name, int64_t clock, const Tensor& grad) {
  if (absl::Status s = BeforePush(); !s.ok()) return MakeReadyFuture<bool>(agent_.executor(), s);
  if (absl::StatusOr<Table> table = FindForGradient(name, grad); !table.ok()) {
    return MakeReadyFuture<bool>(agent_.executor(), table.status());
  }
  const Tensor flat = kernels::Reshape(kernels::Contiguous(grad), {grad.numel()});
  return Traced<bool>(agent_, "push", name, clock, [&] {
    return CountPush(clock, OnLayout<bool>(name, [this, name, clock, flat](const Table& t) {
                       return PushOn(t, name, clock, flat);
                     }));
  });
}

Future<bool> Client::PushOn(const Table& table, const std::string& name, int64_t clock, const Tensor& flat) const {
  std::vector<Future<Ack>> pushed;
  for (size_t i = 0; i < table.servers.size(); ++i) {
    const KeyRange& r = table.ranges[i];
    const Tensor shard = kernels::Narrow(flat, 0, r.begin, r.size());
    pushed.push_back(Call<Ack>(Remember(table.consistency, name, table.servers[i],
                                        [agent = &agent_, server = table.servers[i], name, clock, epoch = table.epoch,
                                         trainer = static_cast<int64_t>(trainer_), shard] {
                                          return agent->Send(server, PushMessage{name, clock, trainer, shard, epoch});
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
  if (names.size() != grads.size() || names.empty()) {
    return MakeReadyFuture<std::vector<Tensor>>(agent_.executor(),
                                                absl::InvalidArgumentError("PushPullMany: one gradient per table"));
  }
  if (absl::Status s = BeforePush(); !s.ok()) return MakeReadyFuture<std::vector<Tensor>>(agent_.executor(), s);
  std::vector<Tensor> flat;  // each gradient as a contiguous 1-D view, once
  for (size_t t = 0; t < names.size(); ++t) {
    absl::StatusOr<Table> table = FindForGradient(names[t], grads[t]);
    if (!table.ok()) return MakeReadyFuture<std::vector<Tensor>>(agent_.executor(), table.status());
    flat.push_back(kernels::Reshape(kernels::Contiguous(grads[t]), {grads[t].numel()}));
  }
  // As OnLayout, for several tables: refused while they are re-sharded, sent again split
  // by the layouts the store then has. Tables in different layouts (re-sharded one after
  // the other) are exchanged one by one.
  rpc::RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(10);
  policy.max_backoff = absl::Milliseconds(500);
  policy.deadline = sync_timeout_;
  policy.retryable = [](const absl::Status& s) { return s.code() == absl::StatusCode::kAborted; };
  const std::string traced_as = absl::StrCat(names.size(), " tables");
  return Traced<std::vector<Tensor>>(agent_, "push-pull", traced_as, clock, [&] {
    return rpc::Retry<std::vector<Tensor>>(
        agent_.executor(), agent_.timers(), std::move(policy),
        [this, names, clock, grads, flat](int attempt) -> Future<std::vector<Tensor>> {
          std::vector<Table> tables;
          for (const std::string& name : names) {
            absl::StatusOr<Table> t = attempt == 0 ? Find(name) : Refreshed(name);
            if (!t.ok()) return MakeReadyFuture<std::vector<Tensor>>(agent_.executor(), t.status());
            tables.push_back(*std::move(t));
          }
          for (const Table& t : tables) {
            if (t.servers != tables[0].servers || t.epoch != tables[0].epoch) {
              std::vector<Future<Tensor>> each;
              for (size_t i = 0; i < names.size(); ++i) each.push_back(PushPull(names[i], clock, grads[i]));
              return WhenAll(agent_.executor(), std::move(each));
            }
          }
          // One push of every table (the one-by-one path above counts each table's
          // push).
          return CountPush(clock, PushPullManyOn(tables, names, clock, flat));
        });
  });
}

Future<std::vector<Tensor>> Client::PushPullManyOn(const std::vector<Table>& tables, const std::vector<std::string>& names,
                                                   int64_t clock, const std::vector<Tensor>& flat) const {
  // One message per server: every table's shard of the gradient; the answer is the list of
  // the tables' shards as of clock + 1.
  const Table& layout = tables[0];
  std::vector<Future<std::vector<Tensor>>> per_server;
  for (size_t i = 0; i < layout.servers.size(); ++i) {
    std::vector<Tensor> shards;
    for (size_t t = 0; t < names.size(); ++t) {
      const KeyRange& r = tables[t].ranges[i];
      shards.push_back(kernels::Narrow(flat[t], 0, r.begin, r.size()));
    }
    per_server.push_back(Call<std::vector<Tensor>>([agent = &agent_, server = layout.servers[i], names, clock,
                                                    epoch = layout.epoch, trainer = static_cast<int64_t>(trainer_),
                                                    shards, timeout = sync_timeout_ * 2] {
      return agent->Send(server, PushPullManyMessage{names, clock, trainer, shards, epoch}, rpc::CallOptions{timeout});
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

// ---------------------------------------------------------------- sparse

namespace {

// A GPU trainer's ids and gradient rows, copied to the host, where the client splits them
// by server (dense tensors cross as they are: the agent stages GPU tensors itself).
Tensor OnHost(const Tensor& t) { return t.defined() && !t.device().is_cpu() ? kernels::ToDevice(t, kCPU) : t; }

}  // namespace

Client::Split Client::SplitIds(const Table& table, const Tensor& ids) {
  const size_t servers = table.servers.size();
  Split split;
  split.positions.resize(servers);
  const Tensor c = kernels::Contiguous(ids);
  const int64_t* id = c.data<int64_t>();
  if (servers == 1) {  // no copy
    split.positions[0].resize(static_cast<size_t>(c.numel()));
    for (int64_t i = 0; i < c.numel(); ++i) split.positions[0][static_cast<size_t>(i)] = i;
    split.ids.push_back(c);
    return split;
  }
  for (int64_t i = 0; i < c.numel(); ++i) {
    split.positions[static_cast<size_t>(table.placement->ServerOf(static_cast<uint64_t>(id[i])))].push_back(i);
  }
  for (const std::vector<int64_t>& pos : split.positions) {
    Tensor part = Tensor::Empty({static_cast<int64_t>(pos.size())}, DType::kInt64);
    for (size_t k = 0; k < pos.size(); ++k) part.data<int64_t>()[k] = id[pos[k]];
    split.ids.push_back(part);
  }
  return split;
}

Future<Tensor> Client::PullRows(const std::string& name, int64_t clock, const Tensor& gpu_or_host_ids) {
  const Tensor ids = OnHost(gpu_or_host_ids);  // the split reads them
  if (absl::StatusOr<Table> table = FindSparse(name); !table.ok()) {
    return MakeReadyFuture<Tensor>(agent_.executor(), table.status());
  }
  if (absl::Status s = CheckIds(name, ids); !s.ok()) return MakeReadyFuture<Tensor>(agent_.executor(), s);
  return Traced<Tensor>(agent_, "pull rows", name, clock, [&] {
    return OnLayout<Tensor>(name, [this, name, clock, ids](const Table& t) { return PullRowsOn(t, name, clock, ids); });
  });
}

Future<Tensor> Client::PullRowsOn(const Table& table, const std::string& name, int64_t clock, const Tensor& ids) const {
  auto split = std::make_shared<Split>(SplitIds(table, ids));
  std::vector<Future<Tensor>> parts;
  std::vector<size_t> asked;
  // Outside kAsync every server is asked, for no rows if need be, so that a pull at
  // `clock` means step clock-1 is complete on all of them (a push for `clock` is then
  // accepted everywhere).
  const bool every_server = table.consistency != Consistency::kAsync;
  for (size_t i = 0; i < table.servers.size(); ++i) {
    if (split->positions[i].empty() && !every_server) continue;
    const Tensor part = split->ids[i];
    asked.push_back(i);
    parts.push_back(Call<Tensor>(WithPushResent(table.consistency, name, table.servers[i],
                                                [agent = &agent_, server = table.servers[i], name, clock, part,
                                                 epoch = table.epoch, timeout = sync_timeout_ * 2] {
                                                  return agent->Send(server, PullRowsMessage{name, clock, part, epoch},
                                                                     rpc::CallOptions{timeout});
                                                })));
  }
  const int64_t n = ids.numel(), dim = table.dim;
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

Future<bool> Client::PushRows(const std::string& name, int64_t clock, const Tensor& gpu_or_host_ids,
                              const Tensor& gpu_or_host_grad) {
  const Tensor ids = OnHost(gpu_or_host_ids), grad = OnHost(gpu_or_host_grad);  // the split reads them
  if (absl::Status s = BeforePush(); !s.ok()) return MakeReadyFuture<bool>(agent_.executor(), s);
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
  const Tensor g = kernels::Contiguous(grad);
  return Traced<bool>(agent_, "push rows", name, clock, [&] {
    return CountPush(clock, OnLayout<bool>(name, [this, name, clock, ids, g](const Table& t) {
                       return PushRowsOn(t, name, clock, ids, g);
                     }));
  });
}

Future<bool> Client::PushRowsOn(const Table& table, const std::string& name, int64_t clock, const Tensor& ids,
                                const Tensor& g) const {
  const Split split = SplitIds(table, ids);
  const bool every_server = table.consistency != Consistency::kAsync;
  std::vector<Future<Ack>> pushed;
  for (size_t i = 0; i < table.servers.size(); ++i) {
    const std::vector<int64_t>& pos = split.positions[i];
    if (pos.empty() && !every_server) continue;
    Tensor rows;
    if (table.servers.size() == 1) {
      rows = g;  // no copy
    } else {
      rows = Tensor::Empty({static_cast<int64_t>(pos.size()), table.dim});
      for (size_t j = 0; j < pos.size(); ++j) {
        std::copy_n(g.data<float>() + pos[j] * table.dim, table.dim, rows.data<float>() + static_cast<int64_t>(j) * table.dim);
      }
    }
    const Tensor part = split.ids[i];
    pushed.push_back(Call<Ack>(Remember(table.consistency, name, table.servers[i],
                                        [agent = &agent_, server = table.servers[i], name, clock, epoch = table.epoch,
                                         trainer = static_cast<int64_t>(trainer_), part, rows] {
                                          return agent->Send(server, PushRowsMessage{name, clock, trainer, part, rows, epoch});
                                        })));
  }
  return AllAcknowledged(agent_.executor(), std::move(pushed));
}

// ---------------------------------------------------------------- elastic trainers

absl::StatusOr<std::vector<std::string>> Client::ServersOf(const std::string& name) const {
  absl::StatusOr<Layout> layout = ReadLayout(name);
  if (!layout.ok()) return layout.status();
  return layout->servers;
}

absl::StatusOr<int64_t> Client::Join(const std::string& name) { return Join(std::vector<std::string>{name}); }

absl::StatusOr<int64_t> Client::Join(const std::vector<std::string>& names) {
  if (names.empty()) return absl::InvalidArgumentError("Join: no tables");
  // Ask every server where it would take this trainer (from < 0), then to take it from
  // the furthest answer; a synchronous step that started meanwhile on some server
  // answers with a later clock: ask all again with that (each round needs a step of the
  // other trainers to complete first, so a few rounds at most).
  // A table being re-sharded answers ABORTED: asked again (from the start) once its new
  // layout is in place.
  int64_t from = -1;
  const absl::Time deadline = absl::Now() + sync_timeout_;
  for (int round = 0; round < 1000; ++round) {
    std::vector<Future<int64_t>> answers;
    for (const std::string& name : names) {
      absl::StatusOr<Table> table = Refreshed(name);
      if (!table.ok()) return table.status();
      for (const std::string& server : table->servers) {
        answers.push_back(Call<int64_t>([agent = &agent_, server, m = JoinTableMessage{name, trainer_, from, table->epoch}] {
          return agent->Send(server, m);
        }));
      }
    }
    absl::StatusOr<std::vector<int64_t>> clocks = WhenAll(agent_.executor(), std::move(answers)).Get();
    if (!clocks.ok() && clocks.status().code() == absl::StatusCode::kAborted && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      from = -1;
      continue;
    }
    if (!clocks.ok()) return clocks.status();
    const int64_t furthest = std::max<int64_t>(0, *std::max_element(clocks->begin(), clocks->end()));
    if (from >= 0 && furthest == from) return from;
    from = furthest;
  }
  return absl::DeadlineExceededError(absl::StrCat("trainer ", trainer_, " could not join table '", names[0],
                                                  "': its steps kept moving on while it asked the servers"));
}

absl::Status Client::Leave(const std::string& name, int64_t last_clock) {
  const absl::Time deadline = absl::Now() + sync_timeout_;
  for (;;) {  // as Join: again while the table is re-sharded
    absl::StatusOr<Table> table = Refreshed(name);
    if (!table.ok()) return table.status();
    std::vector<Future<Ack>> left;
    for (const std::string& server : table->servers) {
      left.push_back(Call<Ack>([agent = &agent_, server, m = LeaveTableMessage{name, trainer_, last_clock, table->epoch}] {
        return agent->Send(server, m);
      }));
    }
    absl::Status s = WhenAll(agent_.executor(), std::move(left)).Get().status();
    if (s.code() != absl::StatusCode::kAborted || absl::Now() >= deadline) return s;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// ---------------------------------------------------------------- re-sharding

absl::Status Client::Reshard(const std::string& name, const std::vector<std::string>& new_servers) {
  if (new_servers.empty() || absl::flat_hash_set<std::string>(new_servers.begin(), new_servers.end()).size() !=
                                 new_servers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Reshard of table '", name, "': the new servers must be one or more ",
                                                   "distinct worker names"));
  }
  absl::StatusOr<Layout> old = ReadLayout(name);
  if (!old.ok()) return old.status();
  if (old->servers == new_servers) return absl::OkStatus();
  const int64_t epoch = old->epoch + 1;
  const absl::Time deadline = absl::Now() + sync_timeout_;
  auto failed = [&](const absl::Status& s, const char* stage) {
    // Nothing changed for the trainers yet: thaw the old shards, drop any imported ones.
    std::vector<Future<Ack>> ends;
    for (const std::vector<std::string>* servers : {&std::as_const(old->servers), &new_servers}) {
      for (const std::string& server : *servers) ends.push_back(agent_.Send(server, EndFreezeMessage{name, epoch, 0}));
    }
    (void)WhenAll(agent_.executor(), std::move(ends)).Get(absl::Seconds(10));
    return absl::Status(s.code(), absl::StrCat("re-sharding table '", name, "' from ", absl::StrJoin(old->servers, ","),
                                               " to ", absl::StrJoin(new_servers, ","), " failed while ", stage,
                                               " (the old layout serves on): ", s.message()));
  };
  auto left = [&] { return rpc::CallOptions{std::max(absl::Milliseconds(1), deadline - absl::Now())}; };
  // 1. Freeze every old shard at one clock: ask where each would freeze, freeze all at the
  // furthest, and again while a shard answers that it was already past it.
  int64_t point = -1;
  for (int round = 0;; ++round) {
    std::vector<Future<int64_t>> answers;
    for (const std::string& server : old->servers) {
      answers.push_back(agent_.Send(server, FreezeMessage{name, old->epoch, point}, left()));
    }
    absl::StatusOr<std::vector<int64_t>> at = WhenAll(agent_.executor(), std::move(answers)).Get();
    if (!at.ok()) return failed(at.status(), "freezing it");
    const int64_t furthest = *std::max_element(at->begin(), at->end());
    if (point >= 0 && furthest == point) break;
    if (round > 100) return failed(absl::DeadlineExceededError("its shards never came to rest at one clock"), "freezing it");
    point = furthest;
  }
  // 2. The shards at rest, cut again for the new layout and put in place beside the old.
  std::vector<Future<ShardForm>> exported;
  for (const std::string& server : old->servers) exported.push_back(agent_.Send(server, ExportMessage{name, old->epoch}, left()));
  absl::StatusOr<std::vector<ShardForm>> forms = WhenAll(agent_.executor(), std::move(exported)).Get();
  if (!forms.ok()) return failed(forms.status(), "reading its shards");
  absl::StatusOr<std::vector<ShardForm>> cut = Resplit(*forms, new_servers, epoch);
  if (!cut.ok()) return failed(cut.status(), "cutting it again");
  std::vector<Future<Ack>> imported;
  for (size_t i = 0; i < new_servers.size(); ++i) {
    imported.push_back(agent_.Send(new_servers[i], ImportMessage{name, (*cut)[i]}, left()));
  }
  if (absl::Status s = WhenAll(agent_.executor(), std::move(imported)).Get().status(); !s.ok()) {
    return failed(s, "sending the new shards");
  }
  // 3. The commit: the new layout in the store, where every client looks it up.
  const std::string record = absl::StrCat(epoch, " ", absl::StrJoin(new_servers, ","));
  if (absl::Status s = agent_.store().Set(LayoutKey(name), record); !s.ok()) {
    // A write that failed may still have been applied (etcd answering late): only a
    // layout that is not in the store may be rolled back.
    absl::StatusOr<std::string> now = agent_.store().Get(LayoutKey(name), absl::Seconds(5));
    if (!now.ok() || *now != record) return failed(s, "writing the new layout to the store");
  }
  // 4. The new shards take over (a request of the new layout would also put them in
  // place), and the servers that left the layout let the table go.
  std::vector<Future<Ack>> ends;
  std::set<std::string> every(old->servers.begin(), old->servers.end());
  every.insert(new_servers.begin(), new_servers.end());
  for (const std::string& server : every) ends.push_back(agent_.Send(server, EndFreezeMessage{name, epoch, 1}));
  absl::Status ended = WhenAll(agent_.executor(), std::move(ends)).Get().status();
  {
    absl::MutexLock lock(&mu_);
    if (auto it = tables_.find(name); it != tables_.end()) Place(it->second, new_servers, epoch);
  }
  if (!ended.ok()) {
    return absl::Status(ended.code(), absl::StrCat("table '", name, "' was re-sharded, but a server did not hear so (",
                                                   ended.message(), "); its new shard takes over at the first request"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- checkpoints, RRefs

std::vector<std::string> Client::AllServers() const {
  std::set<std::string> servers(servers_.begin(), servers_.end());
  absl::MutexLock lock(&mu_);
  for (const auto& [_, table] : tables_) servers.insert(table.servers.begin(), table.servers.end());
  return std::vector<std::string>(servers.begin(), servers.end());
}

Future<CheckpointInfo> Client::Checkpoint() {
  // The layouts as the store has them now: a table re-sharded since this client last
  // heard of it has its shards on other servers (the version must hold them all).
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, _] : tables_) names.push_back(name);
  }
  for (const std::string& name : names) {
    if (absl::StatusOr<Table> now = Refreshed(name); !now.ok()) return MakeReadyFuture<CheckpointInfo>(agent_.executor(), now.status());
  }
  const std::vector<std::string> servers = AllServers();
  std::vector<internal::ManifestTable> layouts;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, t] : tables_) {
      internal::ManifestTable m{name, t.sparse, {}, t.dim, t.epoch, t.servers, {}, {}};
      if (!t.sparse) {
        m.shape.assign(t.shape.begin(), t.shape.end());
        for (const KeyRange& r : t.ranges) {
          m.begins.push_back(r.begin);
          m.ends.push_back(r.end);
        }
      }
      layouts.push_back(std::move(m));
    }
  }
  return Traced<CheckpointInfo>(agent_, "checkpoint", "", -1,
                                [&] { return checkpointer_->Cut(servers, std::move(layouts)); });
}

Future<CheckpointInfo> Client::LastCheckpoint() const { return checkpointer_->Last(); }

absl::Status Client::BeforePush() {
  if (checkpoint_every_ <= absl::ZeroDuration()) return absl::OkStatus();
  if (absl::Status health = checkpointer_->Health(); !health.ok()) return health;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Now() < next_checkpoint_ || checkpointer_->in_flight()) return absl::OkStatus();
    next_checkpoint_ = absl::Now() + checkpoint_every_;
  }
  Checkpoint();  // registered on return: this push cannot pass the cut; written in the background
  return absl::OkStatus();
}

absl::StatusOr<ResumePoint> Client::Resume() {
  const std::vector<std::string> servers = AllServers();
  std::vector<Future<internal::RestoredInfo>> asked;
  for (const std::string& server : servers) {
    asked.push_back(Call<internal::RestoredInfo>(
        [agent = &agent_, server] { return agent->Send(server, internal::RestoredMessage{}); }));
  }
  absl::StatusOr<std::vector<internal::RestoredInfo>> restored = WhenAll(agent_.executor(), std::move(asked)).Get();
  if (!restored.ok()) return restored.status();
  std::vector<std::string> each;
  bool same = true;
  for (size_t i = 0; i < servers.size(); ++i) {
    const internal::RestoredInfo& r = (*restored)[i];
    each.push_back(r.version == 0 ? absl::StrCat(servers[i], " none")
                                  : absl::StrCat(servers[i], " version ", r.version, " (step ", r.step, ")"));
    same = same && r.version == (*restored)[0].version && r.job == (*restored)[0].job;
  }
  if (!same) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the servers restored different checkpoints (", absl::StrJoin(each, ", "),
        "): they must start from one version (a server whose files are damaged falls back to an older one; "
        "restart every server from the same directory, or start fresh)"));
  }
  const internal::RestoredInfo& r = restored->front();
  return ResumePoint{r.version, r.step, r.job};
}

absl::StatusOr<std::vector<rpc::RRef<Tensor>>> Client::ShardRRefs(const std::string& name) {
  absl::StatusOr<Table> table = Refreshed(name);
  if (!table.ok()) return table.status();
  if (table->sparse) return absl::InvalidArgumentError(absl::StrCat("table '", name, "' is sparse: use PullRows/PushRows"));
  std::vector<Future<rpc::RRef<Tensor>>> shards;
  for (const std::string& server : table->servers) shards.push_back(agent_.Send(server, ShardRRefMessage{name}));
  return WhenAll(agent_.executor(), std::move(shards)).Get();
}

absl::StatusOr<Tensor> Client::FetchDense(const std::string& name, const std::vector<rpc::RRef<Tensor>>& shards) {
  absl::StatusOr<Table> table = Find(name);
  if (!table.ok()) return table.status();
  if (shards.size() != table->servers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name, "': ", shards.size(), " shard RRefs for ",
                                                   table->servers.size(), " servers (use ShardRRefs)"));
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
