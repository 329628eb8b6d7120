// DdpReducer: the gradient buckets of one DistributedDataParallel replica and their
// per-iteration state (PyTorch's Reducer). See distributed_data_parallel.h for the
// contract; this file says how.
//
// Each parameter has a slot, a view into its bucket's flat tensor. An iteration is armed
// by Prepare (at Forward); the post-accumulate hook of each parameter copies its gradient
// into its slot and remembers the gradient's handle; a bucket whose slots are all filled
// is launched (allreduce, average) once every bucket before it was; the last gradient
// finalises: waits for every bucket, then makes each slot the parameter's .grad() (PyTorch's
// gradient_as_bucket_view: no copy back; the next iteration's gradient accumulates into
// it unless the optimizer's ZeroGrad dropped it) or, for a gradient held elsewhere (a
// distributed-autograd context), copies the slot into it.
#ifndef GRADWIRE_PARALLEL_SRC_REDUCER_H_
#define GRADWIRE_PARALLEL_SRC_REDUCER_H_

#include <optional>
#include <string>
#include <vector>

#include "gradwire/autograd/grad_hooks.h"
#include "gradwire/collectives/process_group.h"
#include "gradwire/nn/module.h"
#include "gradwire/parallel/distributed_data_parallel.h"

namespace gw::parallel {

class DdpReducer {
 public:
  DdpReducer(const nn::NamedTensors& params, std::shared_ptr<collectives::ProcessGroup> group,
             const DdpOptions& options);
  DdpReducer(const DdpReducer&) = delete;
  DdpReducer& operator=(const DdpReducer&) = delete;

  // Starts an iteration whose backward begins at `outputs`.
  void Prepare(const std::vector<Tensor>& outputs);
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  std::vector<std::vector<std::string>> BucketNames() const;

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    size_t bucket = 0;
    Tensor slot;  // view of the bucket's flat tensor, shaped like the parameter
    autograd::HookHandle hook;
  };
  struct Bucket {
    Tensor flat;
    std::vector<size_t> params;
    size_t pending = 0;
    std::optional<Future<Tensor>> work;
  };

  void OnGradient(size_t index, Tensor& grad);
  void MarkReady(size_t index, Tensor grad, bool launch);
  void LaunchInOrder();
  void Finalize();
  std::vector<size_t> UnusedBy(const std::vector<Tensor>& outputs) const;

  std::shared_ptr<collectives::ProcessGroup> group_;
  const DdpOptions options_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;

  bool sync_ = true;
  bool armed_ = false;            // an iteration is waiting for its gradients
  bool forward_unsynced_ = false;  // the last forward ran under NoSync
  std::vector<bool> ready_;
  std::vector<Tensor> grads_;  // the accumulated gradient each hook was given
  size_t remaining_ = 0;       // parameters of the armed iteration still without gradient
  size_t next_launch_ = 0;
  size_t hooks_fired_ = 0;  // gradients of the armed iteration that arrived from backward
};

}  // namespace gw::parallel

#endif  // GRADWIRE_PARALLEL_SRC_REDUCER_H_
