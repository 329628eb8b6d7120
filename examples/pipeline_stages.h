// Two pipeline stages cut from a model (pipeline_fashion_mnist and parallel/tests'
// zoo_parallel_test): which models can be cut, where, and a stage that keeps BatchNorm's
// running statistics as if its micro-batches had run one after another.
//
// Contract
//   - PipelineModels(): "mlp" (784-256 | 256-128-10, stage s initialised from seed + s, as
//     the example always did) and "resnet" (SmallResNet::Pieces() cut at BalancedCut; each
//     stage worker builds the whole model from the seed and keeps its pieces, so together
//     the stages are exactly the model one process would build from that seed).
//   - BalancedCut(pieces, sample): how many leading pieces go to stage 0 so that the larger
//     stage's estimated multiply-adds per image is smallest; a piece's estimate is its
//     parameter count times its output positions (H*W of a [C, H, W] output, 1 of a
//     vector): exact for convolutions whose outputs share one resolution (the zoo's
//     blocks) and for linear layers. `sample` is one input [1, ...]; each stage gets at
//     least one piece. For the default SmallResNet: stem + 3 blocks | 3 blocks + head.
//   - MakeStage(model, stage, seed, dtype): stage 0 or 1 of `model` as a PipelineStage
//     (gw::Error naming the choices for another model or stage). CutResNet(net, dtype):
//     both stages of a SmallResNet, sharing its parameters and buffers.
//   - Micro-batches carry tags: TagRows(x) appends two columns to a batch [N, F], each
//     row's index in the batch and N. A PipelineStage takes [n, F + 2], runs its pieces on
//     the features reshaped to its sample shape, and passes on [n, F' + 2] (the last stage:
//     its output alone, the logits). The pipeline splits batches by rows, so a stage knows
//     from the first tag which micro-batch it computes.
//   - Training mode: forwards are serialised (they share the buffers), and the buffer
//     updates (BatchNorm's running statistics) of a batch's micro-batches are applied in
//     batch order however the calls arrive (parallel::Pipeline sends a stage its
//     micro-batches in order, but a caller may not, and a worker's pool threads may take
//     concurrent calls in any order): a micro-batch that comes early runs at once
//     (in training mode its output does not depend on the running statistics), the
//     buffers are put back as they were, and its forward is replayed without gradients
//     when its turn comes. The statistics then equal those of the model run on the
//     micro-batches in order in one process, on every run. Row 0 of a batch arriving while
//     the previous batch is incomplete (a failed step) drops that batch's pending updates.
//     Not for stages that draw random numbers in training (dropout would draw twice).
//   - Eval mode (SetStagesTraining(stages, false)): no ordering and no gradients recorded.
//   - RegisterPipelineStages(agent), in Agent::Start's setup of every stage worker:
//     the factory "pipeline_stage" (model, stage, seed, dtype as int64) and the method
//     "pipeline_stage.train" (the module, on).
//   - PipelineModel(pipe): a local nn::Module whose Forward runs a batch (untagged) through
//     the pipeline, throwing gw::Error with the pipeline's status on failure; with
//     TestAccuracy after SetStagesTraining(stages, false).
#ifndef GRADWIRE_EXAMPLES_PIPELINE_STAGES_H_
#define GRADWIRE_EXAMPLES_PIPELINE_STAGES_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/autograd/convolution.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/dist_nn/remote_module.h"
#include "gradwire/models/resnet.h"
#include "gradwire/nn/layers.h"
#include "gradwire/parallel/pipeline.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"

namespace gw::examples {

inline std::vector<std::string> PipelineModels() { return {"mlp", "resnet"}; }

// Runs `pieces` one after another.
inline Tensor RunPieces(const std::vector<std::shared_ptr<nn::Module>>& pieces, Tensor x) {
  for (const auto& piece : pieces) x = piece->Forward(x);
  return x;
}

inline size_t BalancedCut(const std::vector<std::shared_ptr<nn::Module>>& pieces, const Tensor& sample) {
  GW_CHECK(pieces.size() >= 2, "BalancedCut", "two stages need at least two pieces, got ", pieces.size());
  auto probe = std::make_shared<nn::Sequential>(pieces);  // to switch them all to eval mode
  const bool was_training = probe->is_training();
  probe->Eval();  // no running statistics touched
  std::vector<double> cost;
  {
    autograd::NoGradGuard no_grad;
    Tensor x = sample;
    for (const auto& piece : pieces) {
      x = piece->Forward(x);
      double positions = 1;
      for (int64_t d = 2; d < x.dim(); ++d) positions *= static_cast<double>(x.size(d));
      cost.push_back(static_cast<double>(piece->NumParameters()) * positions);
    }
  }
  probe->Train(was_training);
  double total = 0;
  for (double c : cost) total += c;
  size_t best = 1;
  double best_max = std::numeric_limits<double>::infinity(), head = 0;
  for (size_t cut = 1; cut < pieces.size(); ++cut) {
    head += cost[cut - 1];
    if (std::max(head, total - head) < best_max) {
      best_max = std::max(head, total - head);
      best = cut;
    }
  }
  return best;
}

class PipelineStage final : public nn::Module {
 public:
  // `sample_shape`: one input's shape ([1, 28, 28]); `last`: the output goes untagged.
  PipelineStage(std::vector<std::shared_ptr<nn::Module>> pieces, Shape sample_shape, bool last)
      : Module("PipelineStage"), pieces_(std::move(pieces)), sample_shape_(std::move(sample_shape)), last_(last) {
    for (size_t i = 0; i < pieces_.size(); ++i) RegisterModule(absl::StrCat(i), pieces_[i]);
    features_ = 1;
    for (int64_t d : sample_shape_) features_ *= d;
    ordered_ = !NamedBuffers().empty();
  }

  Tensor Forward(const Tensor& tagged) override {
    GW_CHECK(tagged.defined() && tagged.dim() == 2 && tagged.size(1) == features_ + 2, "PipelineStage",
             "expected a tagged micro-batch [n, ", features_ + 2, "] (features of ", ShapeToString(sample_shape_),
             " plus the 2 columns of TagRows), got ", tagged.defined() ? ShapeToString(tagged.sizes()) : "none");
    std::optional<autograd::NoGradGuard> no_grad;
    if (!is_training()) no_grad.emplace();
    const int64_t n = tagged.size(0);
    Shape shape = sample_shape_;
    shape.insert(shape.begin(), n);
    Tensor x = Reshape(Contiguous(Narrow(tagged, 1, 0, features_)), shape);
    // Images arrive contiguous (NCHW) from the previous stage; the zoo's conv nets run in
    // the channels-last layout they convert to at their stem, so a later stage does too
    // (the same kernels as the model in one process, and no reorders).
    if (x.dim() == 4) x = ToChannelsLast(x);
    const Tensor tags = Narrow(tagged, 1, features_, 2);
    const Tensor out = is_training() && ordered_ ? InBatchOrder(x, tags) : RunPieces(pieces_, x);
    if (last_) return out;
    return Cat({Flatten(out, 1), tags}, 1);
  }

 protected:
  std::string ExtraRepr() const override {
    std::vector<std::string> types;
    for (const auto& piece : pieces_) types.push_back(piece->type_name());
    return absl::StrCat("input=", ShapeToString(sample_shape_), ", pieces=[", absl::StrJoin(types, ", "), "], ",
                        NumParameters(), " parameters", last_ ? ", last" : "");
  }

 private:
  Tensor InBatchOrder(const Tensor& x, const Tensor& tags) {
    const std::vector<double> first = kernels::Narrow(tags.detach(), 0, 0, 1).ToVector<double>();
    const auto start = static_cast<int64_t>(first[0]), rows = static_cast<int64_t>(first[1]);
    std::lock_guard<std::mutex> lock(mu_);
    if (start == 0 && expected_ != 0) {  // the previous batch never completed (a failed step)
      pending_.clear();
      expected_ = 0;
    }
    if (start == expected_) {
      Tensor out = RunPieces(pieces_, x);
      Advance(x.size(0), rows);
      for (auto it = pending_.find(expected_); it != pending_.end(); it = pending_.find(expected_)) {
        const Tensor early = it->second;
        pending_.erase(it);
        autograd::NoGradGuard no_grad;
        (void)RunPieces(pieces_, early);  // its buffer updates, now in order
        Advance(early.size(0), rows);
      }
      return out;
    }
    // Early: compute it now, leave the buffers as they were, replay it in its turn.
    std::vector<Tensor> buffers, saved;
    for (const auto& [name, b] : NamedBuffers()) {
      buffers.push_back(b);
      saved.push_back(kernels::Clone(b));
    }
    Tensor out = RunPieces(pieces_, x);
    for (size_t i = 0; i < buffers.size(); ++i) kernels::CopyInPlace(buffers[i], saved[i]);
    pending_[start] = x.detach();
    return out;
  }
  void Advance(int64_t n, int64_t rows) { expected_ = expected_ + n >= rows ? 0 : expected_ + n; }

  std::vector<std::shared_ptr<nn::Module>> pieces_;
  Shape sample_shape_;
  bool last_;
  int64_t features_ = 0;
  bool ordered_ = false;
  std::mutex mu_;
  int64_t expected_ = 0;                 // the first row of the micro-batch whose turn it is
  std::map<int64_t, Tensor> pending_;    // early micro-batches' inputs by first row
};

inline Tensor TagRows(const Tensor& batch) {
  const int64_t n = batch.size(0);
  std::vector<double> tags;
  for (int64_t i = 0; i < n; ++i) {
    tags.push_back(static_cast<double>(i));
    tags.push_back(static_cast<double>(n));
  }
  const Tensor t = Tensor::FromVector(tags, {n, 2});
  return kernels::Cat({kernels::Reshape(batch.detach(), {n, batch.numel() / n}), kernels::ToDType(t, batch.dtype())}, 1);
}

// `net` (for 28x28 single-channel images) as two stages at BalancedCut; they share its
// parameters and buffers.
inline std::vector<std::shared_ptr<PipelineStage>> CutResNet(const models::SmallResNet& net, DType dtype) {
  const std::vector<std::shared_ptr<nn::Module>> pieces = net.Pieces();
  const Tensor sample = Tensor::Zeros({1, 1, 28, 28}, dtype);
  const auto cut = static_cast<std::ptrdiff_t>(BalancedCut(pieces, sample));
  std::vector<std::shared_ptr<nn::Module>> head(pieces.begin(), pieces.begin() + cut);
  std::vector<std::shared_ptr<nn::Module>> tail(pieces.begin() + cut, pieces.end());
  // Stage 1's input: stage 0's output for one image (eval mode: the statistics stay).
  auto probe = std::make_shared<nn::Sequential>(head);
  probe->Eval();
  Shape shape;
  {
    autograd::NoGradGuard no_grad;
    const Tensor out = probe->Forward(sample);
    shape.assign(out.sizes().begin() + 1, out.sizes().end());
  }
  probe->Train();
  return {std::make_shared<PipelineStage>(head, Shape{1, 28, 28}, false),
          std::make_shared<PipelineStage>(tail, shape, true)};
}

inline std::shared_ptr<nn::Module> MakeStage(const std::string& model, int64_t stage, int64_t seed,
                                             DType dtype = DType::kFloat32) {
  GW_CHECK(stage == 0 || stage == 1, "MakeStage", "a pipeline of two stages has stage 0 and 1, not ", stage);
  if (model == "mlp") {  // each stage from its own seed, as pipeline_fashion_mnist always built them
    Generator gen(static_cast<uint64_t>(seed + stage));
    if (stage == 0) {
      return std::make_shared<PipelineStage>(
          std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(784, 256, gen, true, dtype),
                                                   std::make_shared<nn::ReLU>()},
          Shape{784}, false);
    }
    return std::make_shared<PipelineStage>(
        std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(256, 128, gen, true, dtype),
                                                 std::make_shared<nn::ReLU>(),
                                                 std::make_shared<nn::Linear>(128, 10, gen, true, dtype)},
        Shape{256}, true);
  }
  GW_CHECK(model == "resnet", "MakeStage", "--model=", model, " cannot be cut into pipeline stages; choose one of ",
           absl::StrJoin(PipelineModels(), ", "));
  Generator gen(static_cast<uint64_t>(seed));
  const models::SmallResNet net(gen, models::ResNetOptions{.dtype = dtype});
  return CutResNet(net, dtype)[static_cast<size_t>(stage)];
}

inline absl::Status RegisterPipelineStages(rpc::Agent& agent) {
  if (absl::Status s = dist_nn::RegisterModuleFactory(
          agent, "pipeline_stage",
          [](std::string model, int64_t stage, int64_t seed, int64_t dtype) {
            return MakeStage(model, stage, seed, static_cast<DType>(dtype));
          });
      !s.ok()) {
    return s;
  }
  return agent.Register("pipeline_stage.train", [](std::shared_ptr<nn::Module> stage, bool on) {
    stage->Train(on);
    return on;
  });
}

inline absl::Status SetStagesTraining(const std::vector<dist_nn::RemoteModule>& stages, bool on) {
  for (const dist_nn::RemoteModule& stage : stages) {
    absl::StatusOr<bool> r = stage.module_rref().Sync<bool>("pipeline_stage.train", on);
    if (!r.ok()) {
      return absl::Status(r.status().code(), absl::StrCat("cannot switch the stage on ", stage.worker(), " to ",
                                                          on ? "training" : "eval", " mode: ", r.status().message()));
    }
  }
  return absl::OkStatus();
}

class PipelineModel final : public nn::Module {
 public:
  explicit PipelineModel(const parallel::Pipeline& pipe) : Module("PipelineModel"), pipe_(pipe) {}
  Tensor Forward(const Tensor& input) override {
    absl::StatusOr<Tensor> out = pipe_.Forward(TagRows(input));
    if (!out.ok()) throw Error(absl::StrCat("the pipeline's forward failed: ", out.status().ToString()));
    return *out;
  }

 private:
  const parallel::Pipeline& pipe_;
};

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_PIPELINE_STAGES_H_
