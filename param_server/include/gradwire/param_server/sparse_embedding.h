// SparseEmbedding: an embedding table held on the parameter servers, used inside a
// trainer's autograd graph. It is the embedding half of a hybrid job (PyTorch's
// "combining DDP with the distributed RPC framework"): the dense layers are replicated
// with parallel::DistributedDataParallel, the rows live on the servers, and one backward
// pass both allreduces the dense gradients and pushes the rows' gradients.
//
// Contract
//   - SparseEmbedding(client, table) over a sparse table that the trainers created with
//     Client::CreateSparse (any optimizer and consistency mode). One object per trainer
//     and table; it counts the table's steps (the clocks of Client::PullRows/PushRows),
//     starting at `first_clock`.
//   - Lookup(ids) (int64, any shape) pulls the rows of the distinct ids as of the current
//     step (under kSync: once every trainer's push of the previous step was applied) and
//     returns ids.shape + [dim]. LookupBag(ids, offsets, mode) reduces bags of them as
//     nn::EmbeddingBagLookup does ([bags, dim]).
//   - With gradient recording on, the pulled rows are a leaf of the graph: the moment the
//     backward pass has accumulated their gradient (an engine post-accumulate hook,
//     autograd/grad_hooks.h, so in .grad() for a local pass and in the context's
//     gradients for a distributed-autograd pass) it is pushed (Client::PushRows, one
//     message per server) while the rest of the pass goes on. Such a lookup is the step's
//     only one: a second before Step() is FAILED_PRECONDITION (the servers take one push
//     per trainer and step; look up a step's ids at once). Lookups under NoGradGuard
//     (evaluation) push nothing and may be repeated.
//   - Step() ends the step, after the backward pass finished on this worker: waits for
//     the push and moves to the next clock. If the backward pass never reached the rows
//     (or nothing was looked up) it pushes an empty gradient, so that a synchronous
//     table's step still completes on the servers. Returns the push's error (it names
//     the server); the step then counts as ended. Only the first backward pass over a
//     lookup pushes (a copy of the gradient); more passes (retain_graph) make Step()
//     FAILED_PRECONDITION after that push.
//   - Every trainer of a synchronous table calls Step() once per step: one that stops
//     (or destroys its SparseEmbedding after a lookup without Step()) makes the others'
//     next pull wait until the servers' sync timeout.
//   - Errors: a pull's error (naming the server), ids that are not int64.
//   - Not thread-safe: one training loop drives it (the hook may run on another thread;
//     it only touches state of its own under a lock). The Client must outlive it.
#ifndef GRADWIRE_PARAM_SERVER_SPARSE_EMBEDDING_H_
#define GRADWIRE_PARAM_SERVER_SPARSE_EMBEDDING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gradwire/autograd/grad_hooks.h"
#include "gradwire/nn/embedding.h"
#include "gradwire/param_server/client.h"

namespace gw::param_server {

class SparseEmbedding {
 public:
  SparseEmbedding(Client& client, std::string table, int64_t first_clock = 0);
  ~SparseEmbedding();
  SparseEmbedding(const SparseEmbedding&) = delete;
  SparseEmbedding& operator=(const SparseEmbedding&) = delete;

  absl::StatusOr<Tensor> Lookup(const Tensor& ids);
  absl::StatusOr<Tensor> LookupBag(const Tensor& ids, const Tensor& offsets, nn::BagMode mode);
  absl::Status Step();

  int64_t clock() const { return clock_; }
  // Rows pulled by the last lookup (the distinct ids).
  int64_t rows_pulled() const { return rows_pulled_; }
  const std::string& table() const { return table_; }

 private:
  struct Pending;  // the step's push, shared with the hook
  // The pulled rows of ids' distinct values and ids renumbered as positions in them.
  absl::StatusOr<std::pair<Tensor, Tensor>> Pull(const Tensor& ids);

  Client& client_;
  const std::string table_;
  int64_t clock_;
  int64_t rows_pulled_ = 0;
  std::shared_ptr<Pending> pending_;
  autograd::HookHandle hook_;
};

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_SPARSE_EMBEDDING_H_
