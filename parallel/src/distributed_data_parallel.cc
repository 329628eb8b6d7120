#include "gradwire/parallel/distributed_data_parallel.h"

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/kernels.h"
#include "reducer.h"

namespace gw::parallel {

namespace {

// FNV-1a over the dtype and shape of every tensor, in order: replicas of one model agree.
int64_t LayoutHash(const nn::NamedTensors& tensors) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const auto& [name, t] : tensors) {
    mix(static_cast<uint64_t>(t.dtype()));
    mix(t.sizes().size());
    for (int64_t d : t.sizes()) mix(static_cast<uint64_t>(d));
  }
  return static_cast<int64_t>(h);
}

// Rank 0's values of `tensors` on every member, one broadcast per dtype.
absl::Status BroadcastCoalesced(collectives::ProcessGroup& group, const std::vector<Tensor>& tensors) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool}) {
    std::vector<Tensor> same;
    int64_t numel = 0;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype) continue;
      same.push_back(t.detach());
      numel += t.numel();
    }
    if (same.empty()) continue;
    if (dtype == DType::kBool) {
      return absl::InvalidArgumentError("DistributedDataParallel: boolean buffers cannot be broadcast yet");
    }
    Tensor flat = Tensor::Empty({numel}, dtype);
    int64_t offset = 0;
    for (const Tensor& t : same) {
      kernels::CopyInPlace(kernels::View(kernels::Narrow(flat, 0, offset, t.numel()), t.sizes()), t);
      offset += t.numel();
    }
    absl::StatusOr<Tensor> got = group.Broadcast(flat, 0).Get();
    if (!got.ok()) return got.status();
    offset = 0;
    for (const Tensor& t : same) {
      kernels::CopyInPlace(t, kernels::View(kernels::Narrow(flat, 0, offset, t.numel()), t.sizes()));
      offset += t.numel();
    }
  }
  return absl::OkStatus();
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<collectives::ProcessGroup> group,
                                                 DdpOptions options)
    : nn::Module("DistributedDataParallel"),
      module_(RegisterModule("module", std::move(module))),
      group_(std::move(group)),
      options_(options) {}

DistributedDataParallel::~DistributedDataParallel() = default;

absl::StatusOr<std::shared_ptr<DistributedDataParallel>> DistributedDataParallel::Create(
    std::shared_ptr<nn::Module> module, std::shared_ptr<collectives::ProcessGroup> group, DdpOptions options) {
  if (module == nullptr || group == nullptr) {
    return absl::InvalidArgumentError("DistributedDataParallel::Create: the module and the group must be given");
  }
  if (options.bucket_bytes == 0) {
    return absl::InvalidArgumentError("DistributedDataParallel::Create: bucket_bytes must be positive");
  }
  std::shared_ptr<DistributedDataParallel> ddp(
      new DistributedDataParallel(std::move(module), std::move(group), options));
  if (absl::Status s = ddp->BroadcastState(); !s.ok()) return s;
  ddp->reducer_ = std::make_unique<DdpReducer>(ddp->NamedParameters(), ddp->group_, options);
  return ddp;
}

absl::Status DistributedDataParallel::BroadcastState() {
  const nn::NamedTensors params = module_->NamedParameters();
  const nn::NamedTensors buffers = module_->NamedBuffers();
  // First make sure every replica has the same model, so that a mismatch is named as such
  // rather than as disagreeing broadcasts.
  Tensor mine = Tensor::FromVector<int64_t>(
      {static_cast<int64_t>(params.size()), static_cast<int64_t>(buffers.size()), LayoutHash(params),
       LayoutHash(buffers)});
  absl::StatusOr<std::vector<Tensor>> all = group_->AllGather(mine).Get();
  if (!all.ok()) return all.status();
  const std::vector<int64_t> ours = mine.ToVector<int64_t>();
  for (size_t r = 0; r < all->size(); ++r) {
    const std::vector<int64_t> theirs = (*all)[r].ToVector<int64_t>();
    if (theirs != ours) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedDataParallel: the replicas disagree on the model: group rank ", group_->rank(), " (worker ",
          group_->ranks()[static_cast<size_t>(group_->rank())], ") has ", ours[0], " parameters and ", ours[1],
          " buffers, group rank ", r, " (worker ", group_->ranks()[r], ") has ", theirs[0], " and ", theirs[1],
          theirs[0] == ours[0] && theirs[1] == ours[1] ? " with other shapes or dtypes" : "",
          "; every replica must build the same module"));
    }
  }
  std::vector<Tensor> state;
  for (const auto& [name, t] : params) state.push_back(t);
  for (const auto& [name, t] : buffers) {
    state.push_back(t);
    buffers_.push_back(t);  // values change in place (LoadStateDict too), the tensors stay
  }
  autograd::NoGradGuard no_grad;
  return BroadcastCoalesced(*group_, state);
}

Tensor DistributedDataParallel::Forward(const Tensor& input) {
  if (options_.broadcast_buffers && group_->size() > 1 && !buffers_.empty()) {
    autograd::NoGradGuard no_grad;
    if (absl::Status s = BroadcastCoalesced(*group_, buffers_); !s.ok()) {
      throw Error(absl::StrCat("DistributedDataParallel: broadcasting the buffers failed: ", s.ToString()));
    }
  }
  Tensor out = module_->Forward(input);
  PrepareForBackward({out});
  return out;
}

void DistributedDataParallel::PrepareForBackward(const std::vector<Tensor>& outputs) {
  if (!autograd::GradMode::IsEnabled()) return;  // evaluation: no backward follows
  reducer_->Prepare(outputs);
}

std::string DistributedDataParallel::ExtraRepr() const {
  return absl::StrCat(group_->size(), " replicas, ", reducer_ ? reducer_->BucketNames().size() : 0,
                      " gradient buckets: ", module_->ToString());
}

std::vector<std::vector<std::string>> DistributedDataParallel::buckets() const { return reducer_->BucketNames(); }

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.reducer_->sync()) {
  ddp_.reducer_->set_sync(false);
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_.reducer_->set_sync(previous_); }

}  // namespace gw::parallel
