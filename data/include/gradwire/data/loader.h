// DataLoader: mini-batches over a Dataset, optionally shuffled each epoch.
//
// Contract
//   - Shuffling uses an explicit Generator owned by the loader (forked at construction),
//     so a seeded run sees the same batches every time.
//   - Each epoch visits every example exactly once; the last batch may be smaller unless
//     drop_last is set. Batches are fresh tensors (safe to keep).
//   - Shard(rank, world) restricts the loader to a disjoint 1/world of the examples, the
//     way data-parallel trainers split a dataset.
//   - Not thread-safe.
#ifndef GRADWIRE_DATA_LOADER_H_
#define GRADWIRE_DATA_LOADER_H_

#include <vector>

#include "gradwire/data/fashion_mnist.h"

namespace gw::data {

struct Batch {
  Tensor inputs;
  Tensor targets;
};

class DataLoader {
 public:
  DataLoader(const Dataset& dataset, int64_t batch_size, bool shuffle, Generator& gen,
             bool drop_last = false);

  // Restricts this loader to examples i with i % world == rank. REQUIRES: 0 <= rank < world.
  void Shard(int64_t rank, int64_t world);
  // Starts a new epoch (reshuffling when enabled).
  void Reset();
  // Fills *batch and returns true, or returns false at the end of the epoch.
  bool Next(Batch* batch);
  int64_t batches_per_epoch() const;
  int64_t examples_per_epoch() const { return static_cast<int64_t>(order_.size()); }

 private:
  Dataset dataset_;
  int64_t batch_size_;
  bool shuffle_;
  bool drop_last_;
  Generator gen_;
  std::vector<int64_t> order_;
  size_t cursor_ = 0;
};

}  // namespace gw::data

#endif  // GRADWIRE_DATA_LOADER_H_
