// Keeping the replicas of a pipeline stage equal: the stage's side of StageSync
// (ServeStageReplicas) and the driver's (Pipeline::BroadcastParameters, AverageGradients).
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/parallel/pipeline.h"
#include "gradwire/tensor/kernels.h"
#include "stage_messages.h"

namespace gw::parallel {
namespace {

using internal::StageSync;

// The stage side: one per agent, shared by the handler.
class StageReplicas : public std::enable_shared_from_this<StageReplicas> {
 public:
  StageReplicas(rpc::Agent& agent, std::weak_ptr<collectives::Collectives> collectives,
                std::weak_ptr<dist_autograd::DistAutograd> engine)
      : agent_(agent), collectives_(std::move(collectives)), engine_(std::move(engine)) {}

  Future<rpc::Ack> Sync(const std::shared_ptr<nn::Module>& module, const StageSync& m) {
    auto fail = [&](absl::Status s) { return MakeReadyFuture<rpc::Ack>(agent_.executor(), std::move(s)); };
    const std::string where = absl::StrCat(agent_.self().name, " (stage ", m.stage, ")");
    if (m.kind != StageSync::kAverageGradients && m.kind != StageSync::kBroadcastParameters) {
      return fail(absl::InvalidArgumentError(absl::StrCat(where, ": unknown stage-sync kind ", m.kind)));
    }
    if (m.ranks.empty()) return fail(absl::InvalidArgumentError(absl::StrCat(where, ": no replicas listed")));
    const GroupKey key = Key(m.stage, m.ranks);
    absl::StatusOr<std::shared_ptr<collectives::ProcessGroup>> group = Group(key);
    if (!group.ok()) return fail(absl::Status(group.status().code(), absl::StrCat(where, ": ", group.status().message())));
    auto engine = engine_.lock();
    if (engine == nullptr) return fail(absl::CancelledError(absl::StrCat(where, ": shutting down")));

    // What is reduced, per parameter: its gradient in the context, or the parameter.
    const nn::NamedTensors params = module->NamedParameters();
    if (params.empty()) return MakeReadyFuture<rpc::Ack>(agent_.executor(), rpc::Ack{});
    std::vector<Tensor> targets;
    std::vector<std::string> missing;
    for (const auto& [name, p] : params) {
      if (m.kind == StageSync::kBroadcastParameters) {
        targets.push_back(p);
        continue;
      }
      Tensor g = engine->GradOf(m.context, p);
      if (!g.defined()) {
        missing.push_back(name);
        g = Tensor::Zeros(p.sizes(), p.dtype());  // still takes part, so the others do not wait
      }
      targets.push_back(g);
    }
    // One flat tensor per dtype, in parameter order (the same on every replica). When
    // averaging, the first one carries one more element: how many parameters had no
    // gradient here, so that every replica learns that some replica had an incomplete
    // backward and none of them steps on a wrong average.
    const bool average = m.kind == StageSync::kAverageGradients;
    const std::vector<int>& members = (*group)->ranks();
    const int root = static_cast<int>(std::find(members.begin(), members.end(), m.ranks[0]) - members.begin());
    std::map<DType, std::vector<size_t>> by_dtype;
    for (size_t i = 0; i < targets.size(); ++i) by_dtype[targets[i].dtype()].push_back(i);
    std::vector<std::vector<size_t>> parts;
    std::vector<Future<Tensor>> reduced;
    for (const auto& [dtype, indices] : by_dtype) {
      std::vector<Tensor> flat;
      for (size_t i : indices) flat.push_back(kernels::Reshape(kernels::Contiguous(targets[i]), {-1}));
      if (average && reduced.empty()) {
        flat.push_back(Tensor::Full({1}, static_cast<double>(missing.size()), dtype));
      }
      Tensor all = kernels::Cat(flat, 0);
      reduced.push_back(average ? (*group)->AllReduce(all, collectives::ReduceOp::kAvg) : (*group)->Broadcast(all, root));
      parts.push_back(indices);
    }
    return WhenAll(agent_.executor(), std::move(reduced))
        .Then([self = shared_from_this(), key, targets, parts, missing, where, average,
               replicas = m.ranks.size()](const absl::StatusOr<std::vector<Tensor>>& r) -> absl::StatusOr<rpc::Ack> {
          if (!r.ok()) {
            self->Drop(key);  // a failed collective breaks its group: the next sync makes a new one
            return absl::Status(r.status().code(), absl::StrCat(where, ": ", r.status().message()));
          }
          int64_t offset = 0;
          for (size_t d = 0; d < parts.size(); ++d) {
            offset = 0;
            for (size_t i : parts[d]) {
              const Tensor& t = targets[i];
              kernels::CopyInPlace(t, kernels::Reshape(kernels::Narrow((*r)[d], 0, offset, t.numel()), t.sizes()));
              offset += t.numel();
            }
            if (d == 0 && average) {
              const double missing_everywhere =
                  kernels::Narrow((*r)[0], 0, offset, 1).ToVector<double>()[0] * static_cast<double>(replicas);
              if (missing_everywhere > 0.5) {
                return absl::FailedPreconditionError(absl::StrCat(
                    where, ": ", static_cast<int64_t>(missing_everywhere + 0.5),
                    " parameter gradients were missing over the replicas",
                    missing.empty() ? "" : absl::StrCat(" (here: ", absl::StrJoin(missing, ", "), ")"),
                    "; the average is wrong, do not step (every replica's backward must reach every parameter)"));
              }
            }
          }
          return rpc::Ack{};
        });
  }

 private:
  // A stage and its replicas' agent ranks, sorted (the group's order).
  using GroupKey = std::pair<int64_t, std::vector<int>>;
  static GroupKey Key(int64_t stage, const std::vector<int64_t>& ranks) {
    std::vector<int> members(ranks.begin(), ranks.end());
    std::sort(members.begin(), members.end());
    return {stage, std::move(members)};
  }

  // The group of a stage's replicas, made on first use (every member makes it with the
  // same ranks and name; the name counts the groups of this key that broke before, which
  // every member saw fail alike).
  absl::StatusOr<std::shared_ptr<collectives::ProcessGroup>> Group(const GroupKey& key) {
    absl::MutexLock lock(&mu_);
    if (auto it = groups_.find(key); it != groups_.end()) return it->second;
    auto layer = collectives_.lock();
    if (layer == nullptr) return absl::CancelledError("shutting down");
    collectives::GroupOptions options;
    options.name = absl::StrCat("pipeline-stage-", key.first, "-", generations_[key]);
    absl::StatusOr<std::shared_ptr<collectives::ProcessGroup>> g = layer->NewGroup(key.second, options);
    if (g.ok()) groups_.emplace(key, *g);
    return g;
  }
  void Drop(const GroupKey& key) {
    std::shared_ptr<collectives::ProcessGroup> broken;  // closed outside the lock
    absl::MutexLock lock(&mu_);
    if (auto it = groups_.find(key); it != groups_.end()) {
      broken = std::move(it->second);
      groups_.erase(it);
      ++generations_[key];
    }
  }

  rpc::Agent& agent_;
  const std::weak_ptr<collectives::Collectives> collectives_;
  const std::weak_ptr<dist_autograd::DistAutograd> engine_;
  absl::Mutex mu_;
  std::map<GroupKey, std::shared_ptr<collectives::ProcessGroup>> groups_ ABSL_GUARDED_BY(mu_);
  std::map<GroupKey, int64_t> generations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status ServeStageReplicas(rpc::Agent& agent, std::shared_ptr<collectives::Collectives> collectives,
                                std::shared_ptr<dist_autograd::DistAutograd> engine) {
  if (collectives == nullptr || engine == nullptr) {
    return absl::InvalidArgumentError("ServeStageReplicas needs this agent's Collectives and DistAutograd");
  }
  auto replicas = std::make_shared<StageReplicas>(agent, collectives, engine);
  return agent.HandleMethod<std::shared_ptr<nn::Module>, StageSync>(
      [replicas](const rpc::CallInfo&, std::shared_ptr<nn::Module> module, StageSync m) {
        return replicas->Sync(module, m);
      });
}

absl::Status Pipeline::SyncStages(int64_t kind, rpc::GlobalId context,
                                  const std::vector<std::vector<int>>& stage_hosts) const {
  if (stage_hosts.size() != stages_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("stage_hosts lists ", stage_hosts.size(),
                                                   " stages, the pipeline has ", stages_.size()));
  }
  std::vector<Future<rpc::Ack>> done;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const dist_nn::RemoteModule& stage = stages_[s];
    StageSync m{kind, static_cast<int64_t>(s), std::vector<int64_t>(stage_hosts[s].begin(), stage_hosts[s].end()),
                context};
    done.push_back(Map<rpc::Ack>(stage.module_rref().Send(std::move(m), options_.call),
                                 [s, worker = stage.worker()](const absl::StatusOr<rpc::Ack>& r) -> absl::StatusOr<rpc::Ack> {
                                   if (r.ok()) return r;
                                   return absl::Status(r.status().code(), absl::StrCat("pipeline stage ", s, " (on ",
                                                                                       worker, "): ", r.status().message()));
                                 }));
  }
  absl::Status first;
  for (const Future<rpc::Ack>& f : done) {
    absl::StatusOr<rpc::Ack> r = f.Get();  // each bounded by the call's timeout
    if (!r.ok() && first.ok()) first = r.status();
  }
  return first;
}

absl::Status Pipeline::BroadcastParameters(const std::vector<std::vector<int>>& stage_hosts) const {
  return SyncStages(StageSync::kBroadcastParameters, rpc::GlobalId(), stage_hosts);
}

absl::Status Pipeline::AverageGradients(const dist_autograd::Context& ctx,
                                        const std::vector<std::vector<int>>& stage_hosts) const {
  return SyncStages(StageSync::kAverageGradients, ctx.id(), stage_hosts);
}

}  // namespace gw::parallel
