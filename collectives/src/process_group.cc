#include "gradwire/collectives/process_group.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "algorithms.h"
#include "gradwire/tensor/kernels.h"
#include "group_state.h"

namespace gw::collectives {
namespace {

using internal::Kind;
using internal::Signature;

absl::Status CheckDType(DType dtype) {
  if (dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kInt64) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("collectives move float32, float64 and int64 tensors, not ", DTypeName(dtype)));
}

// A list input (reduce_scatter, all_to_all): one tensor per member, all of one dtype.
absl::Status CheckOnePerMember(const char* what, const std::vector<Tensor>& inputs, int members) {
  if (static_cast<int>(inputs.size()) != members) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " takes one tensor per member: ", members, ", got ", inputs.size()));
  }
  for (const Tensor& x : inputs) {
    if (x.dtype() != inputs[0].dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " inputs mix ", DTypeName(inputs[0].dtype()), " and ", DTypeName(x.dtype())));
    }
  }
  return absl::OkStatus();
}

Signature SignatureOf(Kind kind, const Tensor& t, int64_t op) {
  return Signature{static_cast<int64_t>(kind), static_cast<int64_t>(t.dtype()), op,
                   std::vector<int64_t>(t.sizes().begin(), t.sizes().end())};
}

// The contiguous tensor a collective works on, viewed flat; written back to `t` at the end
// when it had to be a copy.
struct Flat {
  explicit Flat(const Tensor& t) : user(t), work(kernels::Contiguous(t)), flat(kernels::View(work, {t.numel()})) {}
  void WriteBack() const {
    if (!work.is_same(user)) kernels::CopyInPlace(user, work);
  }
  Tensor user;
  Tensor work;
  Tensor flat;
};

template <typename T>
std::function<void(absl::Status)> Completer(Promise<T> promise, std::shared_ptr<T> result) {
  return [promise, result](absl::Status s) mutable {
    if (s.ok()) {
      promise.Set(std::move(*result));
    } else {
      promise.Set(std::move(s));
    }
  };
}

}  // namespace

ProcessGroup::ProcessGroup(std::shared_ptr<GroupState> state) : state_(std::move(state)) {}
ProcessGroup::~ProcessGroup() { Close(); }

int ProcessGroup::rank() const { return state_->rank(); }
int ProcessGroup::size() const { return state_->size(); }
const std::vector<int>& ProcessGroup::ranks() const { return state_->ranks(); }
const std::string& ProcessGroup::name() const { return state_->name(); }
void ProcessGroup::Close() { state_->Close(); }

Future<Tensor> ProcessGroup::AllReduce(Tensor t, ReduceOp op) {
  Promise<Tensor> promise(state_->executor());
  Future<Tensor> future = promise.future();
  GroupState::Job job;
  job.signature = SignatureOf(Kind::kAllReduce, t, static_cast<int64_t>(op));
  job.invalid = CheckReducible(t.dtype(), op);
  const bool small = t.nbytes() <= state_->options().small_bytes;
  job.signature.algorithm = small ? 0 : static_cast<int64_t>(state_->options().piece_bytes);
  job.run = [t, op, small](Op& o) -> absl::Status {
    Flat f(t);
    // The ring sends slices of the caller's tensor: they must be taken before it returns.
    absl::Status s = small ? internal::AllReduceRecursiveDoubling(o, f.flat, op) : internal::AllReduceRing(o, f.flat, op);
    if (s.ok() && !small) s = o.Finish();
    if (!s.ok()) return s;
    f.WriteBack();
    return absl::OkStatus();
  };
  job.complete = Completer(promise, std::make_shared<Tensor>(t));
  state_->Enqueue(std::move(job));
  return future;
}

Future<Tensor> ProcessGroup::Broadcast(Tensor t, int root) {
  Promise<Tensor> promise(state_->executor());
  Future<Tensor> future = promise.future();
  GroupState::Job job;
  job.signature = SignatureOf(Kind::kBroadcast, t, root);
  job.invalid = CheckDType(t.dtype());
  if (job.invalid.ok() && (root < 0 || root >= size())) {
    job.invalid = absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of a group of ", size()));
  }
  job.run = [t, root](Op& o) -> absl::Status {
    Flat f(t);
    if (absl::Status s = internal::BroadcastTree(o, f.flat, root); !s.ok()) return s;
    if (absl::Status fin = o.Finish(); !fin.ok()) return fin;
    f.WriteBack();
    return absl::OkStatus();
  };
  job.complete = Completer(promise, std::make_shared<Tensor>(t));
  state_->Enqueue(std::move(job));
  return future;
}

Future<std::vector<Tensor>> ProcessGroup::AllGather(Tensor t) {
  Promise<std::vector<Tensor>> promise(state_->executor());
  Future<std::vector<Tensor>> future = promise.future();
  auto result = std::make_shared<std::vector<Tensor>>();
  GroupState::Job job;
  job.signature = SignatureOf(Kind::kAllGather, t, 0);
  job.invalid = CheckDType(t.dtype());
  const bool small = t.nbytes() <= state_->options().small_bytes;
  job.signature.algorithm = small ? 0 : 1;
  job.run = [t, small, result](Op& o) -> absl::Status {
    Flat f(t);
    absl::Status s = small ? internal::AllGatherDirect(o, f.flat, result.get())
                           : internal::AllGatherRing(o, f.flat, result.get());
    if (s.ok()) s = o.Finish();  // what was sent is the caller's now
    if (!s.ok()) return s;
    for (Tensor& x : *result) x = kernels::View(x, t.sizes());
    return absl::OkStatus();
  };
  job.complete = Completer(promise, result);
  state_->Enqueue(std::move(job));
  return future;
}

Future<Tensor> ProcessGroup::ReduceScatter(std::vector<Tensor> inputs, ReduceOp op) {
  Promise<Tensor> promise(state_->executor());
  Future<Tensor> future = promise.future();
  auto result = std::make_shared<Tensor>();
  GroupState::Job job;
  const DType dtype = inputs.empty() ? DType::kFloat32 : inputs[0].dtype();
  job.signature = Signature{static_cast<int64_t>(Kind::kReduceScatter), static_cast<int64_t>(dtype),
                            static_cast<int64_t>(op), {}};
  for (const Tensor& x : inputs) job.signature.shape.push_back(x.numel());
  job.invalid = CheckReducible(dtype, op);
  if (job.invalid.ok()) job.invalid = CheckOnePerMember("reduce_scatter", inputs, size());
  const int me = rank();
  job.run = [inputs = std::move(inputs), op, result, me](Op& o) -> absl::Status {
    std::vector<Tensor> flats;
    for (const Tensor& x : inputs) flats.push_back(Flat(x).flat);
    absl::Status s = internal::ReduceScatterRing(o, flats, op, result.get());
    if (s.ok()) s = o.Finish();
    if (!s.ok()) return s;
    *result = kernels::View(*result, inputs[static_cast<size_t>(me)].sizes());
    return absl::OkStatus();
  };
  job.complete = Completer(promise, result);
  state_->Enqueue(std::move(job));
  return future;
}

Future<std::vector<Tensor>> ProcessGroup::AllToAll(std::vector<Tensor> inputs) {
  Promise<std::vector<Tensor>> promise(state_->executor());
  Future<std::vector<Tensor>> future = promise.future();
  auto result = std::make_shared<std::vector<Tensor>>();
  GroupState::Job job;
  const DType dtype = inputs.empty() ? DType::kFloat32 : inputs[0].dtype();
  job.signature = Signature{static_cast<int64_t>(Kind::kAllToAll), static_cast<int64_t>(dtype), 0,
                            {static_cast<int64_t>(inputs.size())}};
  job.invalid = CheckDType(dtype);
  if (job.invalid.ok()) job.invalid = CheckOnePerMember("all_to_all", inputs, size());
  job.run = [inputs = std::move(inputs), result](Op& o) -> absl::Status {
    std::vector<Tensor> contiguous;
    for (const Tensor& x : inputs) contiguous.push_back(kernels::Contiguous(x));
    absl::Status s = internal::AllToAllDirect(o, contiguous, result.get());
    return s.ok() ? o.Finish() : s;
  };
  job.complete = Completer(promise, result);
  state_->Enqueue(std::move(job));
  return future;
}

Future<rpc::Ack> ProcessGroup::Barrier() {
  Promise<rpc::Ack> promise(state_->executor());
  Future<rpc::Ack> future = promise.future();
  GroupState::Job job;
  job.signature = Signature{static_cast<int64_t>(Kind::kBarrier), static_cast<int64_t>(DType::kInt64), 0, {}};
  job.run = [](Op& o) { return internal::BarrierDissemination(o); };
  job.complete = Completer(promise, std::make_shared<rpc::Ack>());
  state_->Enqueue(std::move(job));
  return future;
}

}  // namespace gw::collectives
