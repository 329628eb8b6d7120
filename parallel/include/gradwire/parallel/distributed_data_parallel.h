// DistributedDataParallel: one replica of a module per process, kept identical by
// averaging the gradients of every replica (PyTorch's DistributedDataParallel).
//
// Contract
//   - Create(module, group, options) wraps `module` (registered as the child "module", so
//     parameter names read "module.0.weight"). Every member of `group` calls it with a
//     model of the same structure; the parameters and buffers of group rank 0 are
//     broadcast to the others first. Replicas that disagree on the model (number, shape or
//     dtype of parameters) fail on every member with INVALID_ARGUMENT naming the ranks.
//   - Forward(x) runs the module (with options.broadcast_buffers, rank 0's buffers first)
//     and arms the replica for the backward pass that follows. Modules with other forward
//     signatures are run directly and their outputs passed to PrepareForBackward.
//   - During backward, each parameter's gradient goes into a bucket (parameters in reverse
//     registration order, one dtype per bucket, about options.bucket_bytes each) the
//     moment the engine has accumulated it (autograd/grad_hooks.h). A full bucket's
//     allreduce (average) starts at once, on the group's thread, while backward goes on;
//     buckets start in the same order on every member. When the last gradient arrived,
//     backward waits for the buckets and writes the averages back, so after
//     autograd::Backward returns every replica's .grad() holds the same averaged
//     gradients, ready for the optimizer. Each .grad() is then a view of its bucket (as
//     PyTorch's gradient_as_bucket_view): the next synchronised backward overwrites it, so
//     clone a gradient to keep it. Inside a distributed-autograd context the
//     averages are written into the context's gradients instead (where they live).
//   - NoSync(): while the returned guard lives, backward passes only accumulate
//     gradients locally; the first synchronised pass after it averages the sums.
//   - find_unused_parameters: at each Forward the graph behind the outputs is walked and
//     parameters it does not reach count as ready with a zero gradient (their averaged
//     gradient is still written: to .grad(), or inside a distributed-autograd context into
//     the context, by autograd's AccumulateInPassSink), so a model whose forward skips
//     parameters, differently on each replica even, does not wait for them. Without it, an iteration
//     in which some parameter got no gradient ends with its buckets not reduced and the
//     next Forward throws gw::Error naming the parameters and the option.
//   - Failures: a failed allreduce (a dead replica: UNAVAILABLE naming it; a frozen one:
//     DEADLINE_EXCEEDED after the group's timeout) throws gw::Error out of the backward
//     pass with the collective's message; the replica is then unusable (make a new group).
//   - Not thread-safe: one training loop drives a replica.
#ifndef GRADWIRE_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_
#define GRADWIRE_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gradwire/collectives/process_group.h"
#include "gradwire/nn/module.h"
#include "gradwire/tensor/tensor.h"

namespace gw::parallel {

struct DdpOptions {
  // Gradients are reduced in buckets of about this many bytes (PyTorch's bucket_cap_mb).
  size_t bucket_bytes = size_t{1} << 20;
  // Start each bucket's allreduce as soon as it is full, during backward (true), or all
  // of them once backward reached the last parameter (false).
  bool overlap = true;
  bool find_unused_parameters = false;
  // Broadcast rank 0's buffers (running statistics and the like) at every Forward.
  bool broadcast_buffers = true;
};

class DdpReducer;  // internal

class DistributedDataParallel final : public nn::Module {
 public:
  static absl::StatusOr<std::shared_ptr<DistributedDataParallel>> Create(
      std::shared_ptr<nn::Module> module, std::shared_ptr<collectives::ProcessGroup> group,
      DdpOptions options = {});
  ~DistributedDataParallel() override;

  Tensor Forward(const Tensor& input) override;
  // Arms the replica for the backward pass of `outputs` (which Forward does itself).
  void PrepareForBackward(const std::vector<Tensor>& outputs);

  // Backward passes while the guard lives accumulate gradients without averaging them.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard NoSync() { return NoSyncGuard(*this); }

  nn::Module& module() const { return *module_; }
  const collectives::ProcessGroup& group() const { return *group_; }
  // How many buckets the gradients are reduced in, and the parameter names of each.
  std::vector<std::vector<std::string>> buckets() const;

 private:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<collectives::ProcessGroup> group,
                          DdpOptions options);
  absl::Status BroadcastState();
  std::string ExtraRepr() const override;

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<collectives::ProcessGroup> group_;
  const DdpOptions options_;
  std::vector<Tensor> buffers_;  // the module's buffers, broadcast at each Forward
  std::unique_ptr<DdpReducer> reducer_;
};

}  // namespace gw::parallel

#endif  // GRADWIRE_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_
