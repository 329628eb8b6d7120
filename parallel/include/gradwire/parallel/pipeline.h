// Pipeline: a model split into stages that are RemoteModules on different workers, run
// on micro-batches so that the stages compute at the same time (GPipe, 1F1B).
//
// Contract
//   - Pipeline(stages, options): stage s's output is stage s+1's input; the last stage's
//     output goes to the loss on the calling worker (the driver).
//   - ForwardBackward(ctx, input, target, loss) splits the batch along dim 0 into
//     options.chunks micro-batches (sizes differ by at most one; fewer when the batch is
//     smaller), runs every micro-batch through the stages inside the distributed-autograd
//     context `ctx`, and its backward, so that each stage's owner ends up with the
//     gradients of the whole batch in the context (a DistributedOptimizer step follows).
//     `loss` must be a mean over its micro-batch (e.g. CrossEntropyLoss): micro-batch
//     losses are weighted by their share of the batch, so the gradients are those of
//     the mean over the whole batch, as without a pipeline. Returns that loss.
//   - Schedules: kGPipe issues every micro-batch's forward at once (a stage starts
//     micro-batch m+1 as soon as it sent micro-batch m on); k1F1B keeps at most as many
//     micro-batches in flight as there are stages, so activations of at most that many
//     are alive. Each stage receives the micro-batches in order: micro-batch m+1's call
//     to stage s is issued once stage s answered micro-batch m's (so a stage that keeps
//     state in order, like pipeline_fashion_mnist's batch-norm stages, never sees one
//     early). Backward, options.ordered_backward (the default): micro-batch m's backward
//     (a distributed backward pass of its own in the same context; gradients accumulate
//     there) runs as soon as its forward is done, while the forwards of the next ones go
//     on, and the passes run one after another in micro-batch order: each stage adds the
//     micro-batches' gradients in the same order on every run. Deterministic: for stages
//     whose forward depends only on its input and parameters (no dropout or running
//     statistics, whose state would follow the order micro-batches reach the stage), the
//     same inputs and parameters give bitwise the same gradients on every run, and both
//     schedules give the same ones. But the stages then never run backward at the same
//     time (a pass reaches stage s-1 once it left stage s, and the next pass starts once
//     it ended), so backward, about two thirds of a step, is not pipelined.
//     ordered_backward = false (GPipe): once every forward is done, one distributed
//     backward pass over all the micro-batches' losses, so that stage s computes
//     micro-batch m+1's gradients while stage s-1 computes micro-batch m's: the same
//     gradients up to float rounding (each stage adds the micro-batches' gradients in the
//     order they reach it, which may differ from run to run). 1F1B always runs its passes
//     in order. With more than one micro-batch the passes run in SMART mode whatever
//     options.backward.mode says (a FAST pass would wait for the later micro-batches'
//     gradients, dist_autograd.h).
//   - Forward(input) runs the batch through the stages (micro-batches, no context) and
//     returns the last stage's output, e.g. to evaluate.
//   - Failures: a stage whose forward fails ends the step with that status's code and a
//     message naming the stage, its worker and the micro-batch; a failed backward pass is
//     returned as ctx.Backward returns it (it names the worker). Nothing hangs: every
//     call is bounded by options.call's timeout (the agent's default without one) and
//     every backward pass by options.backward.timeout.
//   - Thread-safe for concurrent steps in different contexts.
//
// Data parallelism over pipelines (DDP of pipelines: each replica is a pipeline)
//   - Replica r is a Pipeline of the same stages (same factories and arguments) driven by
//     its own driver; its stage s lives on worker stage_hosts[s][r] (agent ranks). Every
//     replica's driver passes the same `stage_hosts`. The workers hosting stages install
//     ServeStageReplicas(agent, collectives, engine) in Agent::Start's setup.
//   - BroadcastParameters(stage_hosts), called once by every replica before training:
//     each stage takes replica 0's parameters (as DDP does at construction).
//   - AverageGradients(ctx, stage_hosts), by every replica after its ForwardBackward of a
//     step: each stage averages the gradients it holds in the replica's context with the
//     same stage of the other replicas (an allreduce among the workers of stage_hosts[s],
//     run on them, every stage at once). A DistributedOptimizer step per replica then
//     keeps the replicas equal: together the replicas train as one pipeline on the
//     concatenated batch.
//   - Errors name the stage and its worker: INVALID_ARGUMENT when this pipeline's stage
//     s is not on a worker of stage_hosts[s] or the lists differ in length;
//     FAILED_PRECONDITION on every replica when some replica's stage had a parameter
//     without a gradient in its context (the average would be wrong: do not step); a
//     replica that never takes part (its driver died) fails the others with the
//     collective's error after the group's timeout (collectives/process_group.h). A
//     failed sync breaks only that sync: the stage's next sync uses a new group.
//   - One replicated pipeline per set of stage hosts (their stage groups are keyed by
//     stage number and hosts).
#ifndef GRADWIRE_PARALLEL_PIPELINE_H_
#define GRADWIRE_PARALLEL_PIPELINE_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "gradwire/collectives/collectives.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_nn/remote_module.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/tensor/tensor.h"

namespace gw::parallel {

enum class Schedule { kGPipe, k1F1B };

struct PipelineOptions {
  int chunks = 1;
  Schedule schedule = Schedule::kGPipe;
  bool ordered_backward = true;  // see the contract: false overlaps the stages' backward (GPipe)
  dist_autograd::BackwardOptions backward = {};
  rpc::CallOptions call = {};
  // Where the driver records each micro-batch's forward (from its launch to the last
  // stage's answer) and backward pass as spans, category "pipeline": its agent's tracer
  // (&agent.tracer(), rpc/trace.h). Null: not recorded.
  rpc::Tracer* tracer = nullptr;
};

using PipelineLoss = std::function<Tensor(const Tensor& output, const Tensor& target)>;

class Pipeline {
 public:
  Pipeline(std::vector<dist_nn::RemoteModule> stages, PipelineOptions options = {});

  absl::StatusOr<double> ForwardBackward(dist_autograd::Context& ctx, const Tensor& input, const Tensor& target,
                                         const PipelineLoss& loss) const;
  absl::StatusOr<Tensor> Forward(const Tensor& input) const;

  // Data parallelism over pipelines (see the contract): stage_hosts[s] lists the agent
  // ranks of stage s's replicas, replica 0's first.
  absl::Status BroadcastParameters(const std::vector<std::vector<int>>& stage_hosts) const;
  absl::Status AverageGradients(const dist_autograd::Context& ctx,
                                const std::vector<std::vector<int>>& stage_hosts) const;

  const std::vector<dist_nn::RemoteModule>& stages() const { return stages_; }
  const PipelineOptions& options() const { return options_; }

 private:
  // Micro-batch number `m` through every stage (each stage's call issued as soon as the
  // previous stage answered and this stage answered the micro-batch before, whose futures
  // `last` holds per stage and is updated with this one's); with a context, it is current
  // on every thread that issues a stage's call.
  Future<Tensor> Launch(const Tensor& micro, int m, const dist_autograd::Context* ctx,
                        std::vector<std::optional<Future<Tensor>>>& last) const;
  // Launch without its span (options_.tracer).
  Future<Tensor> LaunchStages(const Tensor& micro, int m, const dist_autograd::Context* ctx,
                              std::vector<std::optional<Future<Tensor>>>& last) const;
  std::vector<std::pair<int64_t, int64_t>> Split(int64_t rows) const;
  // ctx.Backward(losses), as a span of options_.tracer: micro-batch m's (m < 0: all of them).
  absl::Status TracedBackward(dist_autograd::Context& ctx, const std::vector<Tensor>& losses, int m,
                              const dist_autograd::BackwardOptions& backward) const;
  // Sends every stage its StageSync message (stage_messages.h) and waits for them all.
  absl::Status SyncStages(int64_t kind, rpc::GlobalId context, const std::vector<std::vector<int>>& stage_hosts) const;

  std::vector<dist_nn::RemoteModule> stages_;
  PipelineOptions options_;
};

// In Agent::Start's setup of every worker that hosts replicated stages.
absl::Status ServeStageReplicas(rpc::Agent& agent, std::shared_ptr<collectives::Collectives> collectives,
                                std::shared_ptr<dist_autograd::DistAutograd> engine);

}  // namespace gw::parallel

#endif  // GRADWIRE_PARALLEL_PIPELINE_H_
