#include "gradwire/parallel/pipeline.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/rpc/traced_future.h"
#include "gradwire/tensor/error.h"

namespace gw::parallel {

Pipeline::Pipeline(std::vector<dist_nn::RemoteModule> stages, PipelineOptions options)
    : stages_(std::move(stages)), options_(std::move(options)) {
  GW_CHECK(!stages_.empty(), "Pipeline", "a pipeline needs at least one stage");
  GW_CHECK(options_.chunks >= 1, "Pipeline", "chunks must be at least 1, got ", options_.chunks);
}

std::vector<std::pair<int64_t, int64_t>> Pipeline::Split(int64_t rows) const {
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(options_.chunks, rows));
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n = rows / chunks + (c < rows % chunks ? 1 : 0);
    out.emplace_back(begin, n);
    begin += n;
  }
  return out;
}

Future<Tensor> Pipeline::Launch(const Tensor& micro, int m, const dist_autograd::Context* ctx,
                                std::vector<std::optional<Future<Tensor>>>& last) const {
  rpc::Tracer* tracer = options_.tracer;
  if (tracer == nullptr || !tracer->enabled()) return LaunchStages(micro, m, ctx, last);
  // Its forward as a span, from here to the last stage's answer (which another thread
  // receives).
  return rpc::TracedUntilReady<Tensor>(*tracer,
                                       {.category = tracer->Intern("pipeline"),
                                        .name = tracer->Intern(absl::StrCat("micro-batch ", m, " forward")),
                                        .arg_names = {tracer->Intern("micro_batch"), tracer->Intern("rows")},
                                        .arg_values = {m, micro.dim() > 0 ? micro.size(0) : 0},
                                        .context = ctx != nullptr ? ctx->id().bits() : 0},
                                       [&] { return LaunchStages(micro, m, ctx, last); });
}

Future<Tensor> Pipeline::LaunchStages(const Tensor& micro, int m, const dist_autograd::Context* ctx,
                                      std::vector<std::optional<Future<Tensor>>>& last) const {
  // Stage s's result, its error named after the stage; issued on the calling thread with
  // the step's context current.
  auto call = [this, m, ctx](size_t s, const Tensor& x) {
    std::optional<dist_autograd::Context::Scope> scope;  // the call joins the step's context
    if (ctx != nullptr) scope.emplace(*ctx);
    const dist_nn::RemoteModule& stage = stages_[s];
    return Map<Tensor>(stage.ForwardAsync(x, options_.call),
                       [s, m, worker = stage.worker()](const absl::StatusOr<Tensor>& r) -> absl::StatusOr<Tensor> {
                         if (r.ok()) return r;
                         return absl::Status(r.status().code(),
                                             absl::StrCat("pipeline stage ", s, " (on ", worker,
                                                          ") failed on micro-batch ", m, ": ", r.status().message()));
                       });
  };
  // Stage s's call on x once the stage answered the micro-batch before (whatever it said).
  auto in_order = [call](size_t s, const Tensor& x, const std::optional<Future<Tensor>>& before) -> Future<Tensor> {
    if (!before) return call(s, x);
    return before->Then([call, s, x](const absl::StatusOr<Tensor>&) { return call(s, x); });
  };
  Future<Tensor> f = in_order(0, micro, last[0]);
  last[0] = f;
  for (size_t s = 1; s < stages_.size(); ++s) {
    f = f.Then([in_order, s, before = last[s], executor = f.executor()](
                   const absl::StatusOr<Tensor>& r) -> Future<Tensor> {
      if (!r.ok()) return MakeReadyFuture<Tensor>(*executor, r.status());
      return in_order(s, *r, before);
    });
    last[s] = f;
  }
  return f;
}

// A micro-batch's backward pass (or all of them: `m` < 0) as a span of the driver's trace.
absl::Status Pipeline::TracedBackward(dist_autograd::Context& ctx, const std::vector<Tensor>& losses, int m,
                                      const dist_autograd::BackwardOptions& backward) const {
  std::optional<rpc::Tracer::Scope> span;
  if (options_.tracer != nullptr && options_.tracer->enabled()) {
    rpc::Tracer& tracer = *options_.tracer;
    span.emplace(tracer, tracer.Intern("pipeline"),
                 tracer.Intern(m >= 0 ? absl::StrCat("micro-batch ", m, " backward")
                                      : absl::StrCat(losses.size(), " micro-batches' backward")));
    span->span().context = ctx.id().bits();
  }
  return ctx.Backward(losses, backward);
}

absl::StatusOr<double> Pipeline::ForwardBackward(dist_autograd::Context& ctx, const Tensor& input,
                                                 const Tensor& target, const PipelineLoss& loss) const {
  GW_CHECK(input.dim() >= 1 && target.dim() >= 1 && input.size(0) == target.size(0), "Pipeline::ForwardBackward",
           "input and target must have the same number of rows (dim 0), got ", ShapeToString(input.sizes()), " and ",
           ShapeToString(target.sizes()));
  const int64_t rows = input.size(0);
  const auto parts = Split(rows);
  const size_t k = parts.size();
  std::vector<Future<Tensor>> outputs;
  outputs.reserve(k);
  std::vector<std::optional<Future<Tensor>>> last(stages_.size());
  auto launch = [&](size_t m) {
    outputs.push_back(Launch(Narrow(input, 0, parts[m].first, parts[m].second), static_cast<int>(m), &ctx, last));
  };
  // Micro-batch m's loss, weighted by its share of the batch (undefined if it failed).
  absl::Status failed;
  double total = 0;
  auto loss_of = [&](size_t m) -> Tensor {
    absl::StatusOr<Tensor> out = outputs[m].Get();
    if (!out.ok()) {
      if (failed.ok()) failed = out.status();
      return Tensor();
    }
    Tensor l = loss(*out, Narrow(target, 0, parts[m].first, parts[m].second)) *
               (static_cast<double>(parts[m].second) / static_cast<double>(rows));
    total += l.item<double>();
    return l;
  };
  auto wait_all = [&] {
    for (const Future<Tensor>& f : outputs) (void)f.Get();  // each bounded by the call timeout
  };
  // Each micro-batch's backward is a distributed pass of its own, run as soon as its
  // forward is done, one after another in micro-batch order: every stage then adds the
  // micro-batches' gradients in the same order on every run (one pass over all of them
  // would add them in the order they happen to reach each stage, and float sums depend
  // on that order). GPipe has every forward in flight at once, 1F1B as many as there are
  // stages (the activations alive); both give bitwise the same gradients.
  // FAST mode counts every send recorded in the context, so the first pass would wait for
  // gradients of micro-batches whose passes come later: SMART (counting only what each
  // pass reaches) whenever there is more than one.
  dist_autograd::BackwardOptions backward = options_.backward;
  if (k > 1) backward.mode = dist_autograd::Mode::kSmart;
  if (!options_.ordered_backward && options_.schedule == Schedule::kGPipe && k > 1) {
    // Every forward, then one pass over every micro-batch: the stages' backward overlaps.
    for (size_t m = 0; m < k; ++m) launch(m);
    std::vector<Tensor> losses;
    for (size_t m = 0; m < k; ++m) {
      Tensor l = loss_of(m);
      if (failed.ok()) losses.push_back(l);
    }
    if (failed.ok()) failed = TracedBackward(ctx, losses, -1, backward);
    wait_all();
    if (!failed.ok()) return failed;
    return total;
  }
  const size_t depth = options_.schedule == Schedule::kGPipe ? k : stages_.size();
  size_t next = 0;
  for (; next < std::min(depth, k); ++next) launch(next);
  for (size_t m = 0; m < k; ++m) {
    Tensor l = loss_of(m);
    if (!failed.ok()) break;
    if (absl::Status s = TracedBackward(ctx, {l}, static_cast<int>(m), backward); !s.ok()) {
      failed = s;
      break;
    }
    if (next < k) launch(next++);
  }
  wait_all();
  if (!failed.ok()) return failed;
  return total;
}

absl::StatusOr<Tensor> Pipeline::Forward(const Tensor& input) const {
  GW_CHECK(input.dim() >= 1, "Pipeline::Forward", "the input needs a batch dimension");
  std::vector<Future<Tensor>> outputs;
  std::vector<std::optional<Future<Tensor>>> last(stages_.size());
  for (const auto& [begin, n] : Split(input.size(0))) {
    outputs.push_back(Launch(Narrow(input, 0, begin, n), static_cast<int>(outputs.size()), nullptr, last));
  }
  std::vector<Tensor> parts;
  absl::Status failed;
  for (const Future<Tensor>& f : outputs) {
    absl::StatusOr<Tensor> r = f.Get();
    if (!r.ok() && failed.ok()) failed = r.status();
    if (r.ok()) parts.push_back(*r);
  }
  if (!failed.ok()) return failed;
  return parts.size() == 1 ? parts[0] : Cat(parts, 0);
}

}  // namespace gw::parallel
