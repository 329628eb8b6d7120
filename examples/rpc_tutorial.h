// What the programs written after PyTorch's RPC tutorials share (rpc_ps_fashion_mnist:
// "Implementing a Parameter Server Using Distributed RPC Framework"; rnn_fashion_mnist:
// "Distributed RNN using Distributed Autograd and Distributed Optimizer"), and the models
// they distribute, which the gradient tests (dist_autograd/tests/rpc_tutorials_test.cc)
// run against the same models in one process. Header-only, no flags.
//
// Contract
//   - The job (RunTutorialJob): rank 0 is the server, which hosts the remote modules and
//     serves until every trainer is done; ranks 1.. are trainers. Every worker installs
//     distributed autograd and `setup` (the module factories); a failure says what went
//     wrong and what to do, with exit status 2.
//   - ParameterServer (rpc_ps): the tutorial's server-side module, one per server worker
//     however many trainers ask for it (RegisterParameterServer's factory
//     "parameter_server"(model, seed) returns the same module to every caller, as the
//     tutorial's get_parameter_server; asking for another model or seed is an error). It
//     wraps a zoo model (models::Create), in training mode. The trainers run concurrently;
//     a trainer's step has two phases on the shared model: computing (forward and
//     backward, between BeginStep and BeginUpdate) and updating (the optimizer step,
//     between BeginUpdate and EndStep); the functions "begin_step", "begin_update" and
//     "end_step" on the module's RRef answer once the phase may start. Any number of
//     trainers compute at once; an update runs alone, once no trainer computes (so no
//     backward pass finds a weight it saved changed in place); steps wait while an update
//     runs or waits, and updates run in the order they asked. So concurrent trainers
//     compute their gradients on the same weights, then apply them one after the other.
//     The tutorial as written lets updates overlap backward passes (PyTorch fails with
//     "modified by an inplace operation" with 2+ trainers: pytorch/tutorials#2095;
//     pytorch/examples#842 makes the whole step take turns). Forward runs one at a time
//     (dropout draws from the model's generator, BatchNorm updates its statistics); the
//     backward passes run at once on the server's threads. Evaluate(images) is Forward in
//     eval mode without gradients (the function "evaluate"), the model back in training
//     mode afterwards (the example evaluates between epochs, when no step is under way).
//   - RowRnn (rnn): the tutorial's RNNModel over image rows: encoder Linear(W, E) (the
//     tutorial's EmbeddingTable) on the server, applied to every row of [N, H*W] or
//     [N, 1, H, W] images; a local LSTM(E, hidden, layers, batch_first); decoder
//     Linear(hidden, 10) on the server, applied to the last step's output: logits [N, 10].
//     Initialised from `seed`: encoder Generator(seed), LSTM Generator(seed + 1), decoder
//     Generator(seed + 2). ParameterRRefs lists encoder, LSTM, decoder parameters.
//   - BatchedAccuracy(test, forward, batch): the accuracy of forward(images) (logits or
//     log-probabilities) over the test set in batches of `batch` without gradients; the
//     first failing forward's status otherwise.
//   - EpochEnd: a barrier of the trainers at the server (the function "epoch_end" that
//     RegisterEpochEnd serves): AllMax(round, value) returns, once every trainer called it
//     for `round`, the largest value they gave.
#ifndef GRADWIRE_EXAMPLES_RPC_TUTORIAL_H_
#define GRADWIRE_EXAMPLES_RPC_TUTORIAL_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/gradwire.h"
#include "gradwire/models/zoo.h"
#include "gradwire/nn/recurrent.h"

namespace gw::examples {

// ---- The job ----

struct TutorialWorker {
  std::shared_ptr<rpc::Agent> agent;
  std::shared_ptr<dist_autograd::DistAutograd> engine;
  int trainer = 0, trainers = 1;  // this trainer (0-based) and how many there are
  std::string server;             // rank 0's name
};

// Joins the job started by `gradwire launch -n N` (N in [min_world, max_world]), runs
// `setup` on every worker, then: rank 0 serves until the trainers are done, the others
// run `train`. Returns the process's exit status.
inline int RunTutorialJob(const char* program, int min_world, int max_world, rpc::Setup setup,
                          const std::function<int(TutorialWorker&)>& train) {
  absl::StatusOr<rpc::AgentOptions> options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) {
    std::fprintf(stderr, "error: not started by a launcher (run it as `gradwire launch -n %d %s`): %s\n", min_world,
                 program, std::string(options.status().message()).c_str());
    return 2;
  }
  if (options->world_size < min_world || options->world_size > max_world) {
    std::fprintf(stderr,
                 "error: WORLD_SIZE is %d, but %s needs %d to %d workers (rank 0 the server, the others trainers): "
                 "run `gradwire launch -n %d %s`\n",
                 options->world_size, program, min_world, max_world, min_world, program);
    return 2;
  }
  options->start_timeout = absl::Seconds(120);   // workers load Fashion-MNIST first
  options->shutdown_timeout = absl::Hours(24);   // the server serves until the trainers are done
  TutorialWorker w;
  auto agent = rpc::Agent::Start(*options, [&](rpc::Agent& a) -> absl::Status {
    if (absl::Status s = rpc::Assign(dist_autograd::DistAutograd::Install(a), w.engine); !s.ok()) return s;
    return setup(a);
  });
  if (!agent.ok()) {
    std::fprintf(stderr, "error: cannot join the group: %s\n", std::string(agent.status().message()).c_str());
    return 2;
  }
  w.agent = *agent;
  w.server = w.agent->workers()[0].name;
  w.trainers = options->world_size - 1;
  w.trainer = options->rank - 1;
  int code = 0;
  if (options->rank == 0) {
    std::printf("%s: serving the model to %d trainer%s\n", w.agent->self().name.c_str(), w.trainers,
                w.trainers == 1 ? "" : "s");
    std::fflush(stdout);
  } else {
    code = train(w);
  }
  if (absl::Status s = w.agent->Shutdown(); !s.ok()) {
    std::fprintf(stderr, "error: shutdown: %s\n", std::string(s.message()).c_str());
    return code != 0 ? code : 2;
  }
  return code;
}

// ---- Evaluation ----

template <typename Forward>
absl::StatusOr<double> BatchedAccuracy(const data::Dataset& test, Forward&& forward, int64_t batch = 1000) {
  autograd::NoGradGuard no_grad;
  const int64_t n = test.images.size(0);
  double correct = 0;
  for (int64_t start = 0; start < n; start += batch) {
    const int64_t len = std::min(batch, n - start);
    absl::StatusOr<Tensor> out = forward(Narrow(test.images, 0, start, len));
    if (!out.ok()) return out.status();
    correct += nn::Accuracy(*out, Narrow(test.labels, 0, start, len)) * static_cast<double>(len);
  }
  return correct / static_cast<double>(std::max<int64_t>(n, 1));
}

// ---- The trainers' barrier ----

class EpochEnd {
 public:
  explicit EpochEnd(int trainers) : trainers_(trainers) {}

  // Served on the server: completes once `trainers` calls for `round` have come.
  Future<double> Arrive(rpc::Executor& executor, int64_t round, double value) {
    absl::MutexLock lock(&mu_);
    auto [it, fresh] = rounds_.try_emplace(round, executor);
    Round& r = it->second;
    r.max = std::max(r.max, value);
    Future<double> out = r.done.future();
    if (++r.arrived == trainers_) {
      r.done.Set(r.max);
      rounds_.erase(it);  // the promise lives on in the futures
    }
    return out;
  }

 private:
  struct Round {
    explicit Round(rpc::Executor& e) : done(e) {}
    Promise<double> done;
    double max = -1e300;
    int arrived = 0;
  };
  const int trainers_;
  absl::Mutex mu_;
  std::map<int64_t, Round> rounds_ ABSL_GUARDED_BY(mu_);
};

// In the server's setup: serves "epoch_end"(round, value) for `trainers` trainers.
inline absl::Status RegisterEpochEnd(rpc::Agent& agent, int trainers) {
  auto barrier = std::make_shared<EpochEnd>(trainers);
  rpc::Agent* a = &agent;
  return agent.Register("epoch_end", [barrier, a](int64_t round, double value) {
    return barrier->Arrive(a->executor(), round, value);
  });
}

// On a trainer: the largest value the trainers gave for `round` (waits for all of them).
inline absl::StatusOr<double> AllMax(const TutorialWorker& w, int64_t round, double value) {
  return w.agent->Sync<double>(w.server, "epoch_end", round, value, rpc::CallOptions{.timeout = absl::Hours(24)});
}

// ---- rpc_ps: the parameter server ----

class ParameterServer final : public nn::Module {
 public:
  explicit ParameterServer(std::shared_ptr<nn::Module> model) : Module("ParameterServer") {
    model_ = RegisterModule("model", std::move(model));
  }
  Tensor Forward(const Tensor& images) override {
    absl::MutexLock lock(&mu_);
    return model_->Forward(images);
  }
  Tensor Evaluate(const Tensor& images) {
    absl::MutexLock lock(&mu_);
    autograd::NoGradGuard no_grad;
    model_->Eval();
    struct BackToTraining {
      nn::Module& m;
      ~BackToTraining() { m.Train(); }
    } back{*model_};
    return model_->Forward(images);
  }

  // Completes once the trainer may compute (no update runs or waits).
  Future<bool> BeginStep(rpc::Executor& executor) {
    Promise<bool> go(executor);
    Grant(Enqueue(&waiting_steps_, go, 0));
    return go.future();
  }
  // This trainer stops computing; completes once its update may run (alone).
  Future<bool> BeginUpdate(rpc::Executor& executor) {
    Promise<bool> go(executor);
    Grant(Enqueue(&waiting_updates_, go, -1));
    return go.future();
  }
  // The update has run.
  void EndStep() {
    std::vector<Promise<bool>> go;
    {
      absl::MutexLock lock(&mu_);
      updating_ = false;
      go = Next();
    }
    Grant(std::move(go));
  }

 private:
  std::vector<Promise<bool>> Enqueue(std::deque<Promise<bool>>* queue, Promise<bool> p, int computing_change) {
    absl::MutexLock lock(&mu_);
    computing_ += computing_change;
    queue->push_back(std::move(p));
    return Next();
  }
  // The phases that may start now (their promises are set outside the lock).
  std::vector<Promise<bool>> Next() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Promise<bool>> go;
    if (updating_) return go;
    if (!waiting_updates_.empty()) {
      if (computing_ == 0) {
        updating_ = true;
        go.push_back(std::move(waiting_updates_.front()));
        waiting_updates_.pop_front();
      }
      return go;
    }
    computing_ += static_cast<int>(waiting_steps_.size());
    go.assign(std::make_move_iterator(waiting_steps_.begin()), std::make_move_iterator(waiting_steps_.end()));
    waiting_steps_.clear();
    return go;
  }
  static void Grant(std::vector<Promise<bool>> go) {
    for (Promise<bool>& p : go) p.Set(true);
  }

  absl::Mutex mu_;
  std::shared_ptr<nn::Module> model_;
  int computing_ ABSL_GUARDED_BY(mu_) = 0;  // trainers between BeginStep and BeginUpdate
  bool updating_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Promise<bool>> waiting_steps_ ABSL_GUARDED_BY(mu_);
  std::deque<Promise<bool>> waiting_updates_ ABSL_GUARDED_BY(mu_);
};

// The server's one ParameterServer, built by the first trainer's request.
class ParameterServerHost {
 public:
  explicit ParameterServerHost(DType dtype) : dtype_(dtype) {}
  absl::StatusOr<std::shared_ptr<nn::Module>> Get(const std::string& model, int64_t seed) {
    absl::MutexLock lock(&mu_);
    if (server_) {
      if (model != model_ || seed != seed_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the parameter server already holds model '", model_, "' (seed ", seed_, "), asked for '", model,
            "' (seed ", seed, "): every trainer must be started with the same --model and --seed"));
      }
      return server_;
    }
    Generator gen(static_cast<uint64_t>(seed));
    absl::StatusOr<std::shared_ptr<nn::Module>> m = models::Create(model, gen, dtype_);
    if (!m.ok()) return m.status();
    server_ = std::make_shared<ParameterServer>(*m);
    model_ = model;
    seed_ = seed;
    return server_;
  }
  std::shared_ptr<ParameterServer> server() {
    absl::MutexLock lock(&mu_);
    return server_;
  }

 private:
  const DType dtype_;
  absl::Mutex mu_;
  std::shared_ptr<ParameterServer> server_ ABSL_GUARDED_BY(mu_);
  std::string model_ ABSL_GUARDED_BY(mu_);
  int64_t seed_ ABSL_GUARDED_BY(mu_) = 0;
};

// In the server's setup: the factory "parameter_server"(model, seed) and "evaluate".
inline absl::Status RegisterParameterServer(rpc::Agent& agent, std::shared_ptr<ParameterServerHost> host) {
  // A factory's result must be a module; a failure inside comes back as a status.
  struct Factory {
    std::shared_ptr<ParameterServerHost> host;
    std::shared_ptr<nn::Module> operator()(std::string model, int64_t seed) const {
      absl::StatusOr<std::shared_ptr<nn::Module>> m = host->Get(model, seed);
      if (!m.ok()) throw Error(std::string(m.status().message()));
      return *m;
    }
  };
  if (absl::Status s = dist_nn::RegisterModuleFactory(agent, "parameter_server", Factory{std::move(host)}); !s.ok()) {
    return s;
  }
  auto server_of = [](const std::shared_ptr<nn::Module>& m, const char* what) -> absl::StatusOr<ParameterServer*> {
    auto* ps = dynamic_cast<ParameterServer*>(m.get());
    if (ps == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " needs the parameter server's module (TrainerNet), got ", m->type_name()));
    }
    return ps;
  };
  rpc::Agent* a = &agent;
  // The phases that may have to wait: answered once the phase may start.
  using Phase = Future<bool> (ParameterServer::*)(rpc::Executor&);
  for (const auto& entry : {std::pair<const char*, Phase>{"begin_step", &ParameterServer::BeginStep},
                            std::pair<const char*, Phase>{"begin_update", &ParameterServer::BeginUpdate}}) {
    const char* name = entry.first;
    const Phase phase = entry.second;
    if (absl::Status s = agent.Register(name,
                                        [server_of, a, name, phase](std::shared_ptr<nn::Module> m) -> Future<bool> {
                                          absl::StatusOr<ParameterServer*> ps = server_of(m, name);
                                          if (!ps.ok()) return MakeReadyFuture<bool>(a->executor(), ps.status());
                                          return ((*ps)->*phase)(a->executor());
                                        });
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = agent.Register("end_step",
                                      [server_of](std::shared_ptr<nn::Module> m) -> absl::StatusOr<bool> {
                                        absl::StatusOr<ParameterServer*> ps = server_of(m, "end_step");
                                        if (!ps.ok()) return ps.status();
                                        (*ps)->EndStep();
                                        return true;
                                      });
      !s.ok()) {
    return s;
  }
  return agent.Register("evaluate", [server_of](std::shared_ptr<nn::Module> m, Tensor images) -> absl::StatusOr<Tensor> {
    absl::StatusOr<ParameterServer*> ps = server_of(m, "evaluate");
    if (!ps.ok()) return ps.status();
    return (*ps)->Evaluate(images);
  });
}

// The tutorial's TrainerNet: the server's model, called through RPC.
struct TrainerNet {
  dist_nn::RemoteModule server;
  absl::StatusOr<Tensor> Forward(const Tensor& images) const { return server.Forward(images); }
  absl::StatusOr<Tensor> Evaluate(const Tensor& images) const {
    return server.module_rref().Sync<Tensor>("evaluate", images);
  }
  // This trainer's phases on the shared model (see ParameterServer).
  absl::Status BeginStep() const { return server.module_rref().Sync<bool>("begin_step").status(); }
  absl::Status BeginUpdate() const { return server.module_rref().Sync<bool>("begin_update").status(); }
  absl::Status EndStep() const { return server.module_rref().Sync<bool>("end_step").status(); }
};

// ---- rnn: the model over image rows ----

struct RowRnnOptions {
  int64_t width = 28;         // pixels per row: the encoder's input
  int64_t embedding = 64;     // the encoder's output, the LSTM's input
  int64_t hidden = 128;
  int64_t layers = 2;
  int64_t classes = 10;
  DType dtype = DType::kFloat32;
};

// In the server's setup: the factory "linear"(in, out, seed) of the encoder and decoder.
inline absl::Status RegisterRowRnnModules(rpc::Agent& agent, DType dtype) {
  return dist_nn::RegisterModuleFactory(agent, "linear", [dtype](int64_t in, int64_t out, int64_t seed) {
    Generator gen(static_cast<uint64_t>(seed));
    return std::make_shared<nn::Linear>(in, out, gen, /*bias=*/true, dtype);
  });
}

class RowRnn {
 public:
  static absl::StatusOr<RowRnn> Create(rpc::Agent& agent, const std::string& server, int64_t seed,
                                       const RowRnnOptions& o = {}) {
    absl::StatusOr<dist_nn::RemoteModule> encoder =
        dist_nn::RemoteModule::Create(agent, server, "linear", o.width, o.embedding, seed);
    if (!encoder.ok()) return encoder.status();
    Generator gen(static_cast<uint64_t>(seed + 1));
    auto lstm = std::make_shared<nn::LSTM>(o.embedding, o.hidden, gen,
                                           nn::RnnOptions{.num_layers = o.layers, .batch_first = true}, o.dtype);
    absl::StatusOr<dist_nn::RemoteModule> decoder =
        dist_nn::RemoteModule::Create(agent, server, "linear", o.hidden, o.classes, seed + 2);
    if (!decoder.ok()) return decoder.status();
    return RowRnn(o, *std::move(encoder), std::move(lstm), *std::move(decoder));
  }

  absl::StatusOr<Tensor> Forward(const Tensor& images) const {
    const int64_t n = images.size(0);
    if (images.numel() % (n * options_.width) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("RowRnn: images of ", images.numel() / std::max<int64_t>(n, 1),
                                                     " pixels are not rows of ", options_.width));
    }
    const int64_t rows = images.numel() / (n * options_.width);
    absl::StatusOr<Tensor> emb = encoder_.Forward(Reshape(images, {n * rows, options_.width}));
    if (!emb.ok()) return emb.status();
    const Tensor out = lstm_->Forward(Reshape(*emb, {n, rows, options_.embedding}));  // [N, rows, hidden]
    return decoder_.Forward(Select(out, 1, rows - 1));
  }

  // The encoder's, the LSTM's (owned here) and the decoder's parameters.
  absl::StatusOr<std::vector<rpc::RRef<Tensor>>> ParameterRRefs(rpc::Agent& agent) const {
    std::vector<rpc::RRef<Tensor>> all;
    for (const dist_nn::RemoteModule* m : {&encoder_, &decoder_}) {
      absl::StatusOr<std::vector<rpc::RRef<Tensor>>> p = m->RemoteParameters();
      if (!p.ok()) return p.status();
      all.insert(all.end(), p->begin(), p->end());
      if (m == &encoder_) {
        for (const Tensor& t : lstm_->Parameters()) all.push_back(agent.Own(t));
      }
    }
    return all;
  }

  nn::LSTM& lstm() const { return *lstm_; }
  const dist_nn::RemoteModule& encoder() const { return encoder_; }
  const dist_nn::RemoteModule& decoder() const { return decoder_; }
  std::string ToString() const {
    return absl::StrCat("encoder Linear(", options_.width, ", ", options_.embedding, ") on ", encoder_.worker(),
                        " per row -> ", lstm_->ToString(), " here -> decoder Linear(", options_.hidden, ", ",
                        options_.classes, ") on ", decoder_.worker());
  }

 private:
  RowRnn(RowRnnOptions o, dist_nn::RemoteModule encoder, std::shared_ptr<nn::LSTM> lstm,
         dist_nn::RemoteModule decoder)
      : options_(o), encoder_(std::move(encoder)), lstm_(std::move(lstm)), decoder_(std::move(decoder)) {}

  RowRnnOptions options_;
  dist_nn::RemoteModule encoder_;
  std::shared_ptr<nn::LSTM> lstm_;
  dist_nn::RemoteModule decoder_;
};

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_RPC_TUTORIAL_H_
