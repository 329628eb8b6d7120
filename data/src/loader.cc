#include "gradwire/data/loader.h"

#include <numeric>

#include "gradwire/tensor/kernels.h"

namespace gw::data {

DataLoader::DataLoader(const Dataset& dataset, int64_t batch_size, bool shuffle, Generator& gen,
                       bool drop_last)
    : dataset_(dataset), batch_size_(batch_size), shuffle_(shuffle), drop_last_(drop_last),
      gen_(gen.Fork()) {
  GW_CHECK(batch_size > 0, "DataLoader", "batch size must be positive, got ", batch_size);
  GW_CHECK(dataset.images.defined() && dataset.labels.defined() &&
               dataset.images.size(0) == dataset.labels.size(0),
           "DataLoader", "dataset images and labels must have the same number of rows");
  Shard(0, 1);
}

void DataLoader::Shard(int64_t rank, int64_t world) {
  GW_CHECK(world > 0 && rank >= 0 && rank < world, "DataLoader::Shard", "rank ", rank,
           " is not in [0, ", world, ")");
  order_.clear();
  for (int64_t i = rank; i < dataset_.size(); i += world) order_.push_back(i);
  Reset();
}

void DataLoader::Reset() {
  cursor_ = 0;
  if (!shuffle_) return;
  for (size_t i = order_.size(); i > 1; --i) {  // Fisher-Yates
    std::swap(order_[i - 1], order_[gen_.NextBelow(i)]);
  }
}

int64_t DataLoader::batches_per_epoch() const {
  const int64_t n = static_cast<int64_t>(order_.size());
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

bool DataLoader::Next(Batch* batch) {
  const size_t remaining = order_.size() - cursor_;
  if (remaining == 0 || (drop_last_ && remaining < static_cast<size_t>(batch_size_))) return false;
  const size_t n = std::min(remaining, static_cast<size_t>(batch_size_));
  std::vector<int64_t> idx(order_.begin() + static_cast<std::ptrdiff_t>(cursor_),
                           order_.begin() + static_cast<std::ptrdiff_t>(cursor_ + n));
  cursor_ += n;
  Tensor index = Tensor::FromVector<int64_t>(idx);
  batch->inputs = kernels::IndexSelect(dataset_.images, 0, index);
  batch->targets = kernels::IndexSelect(dataset_.labels, 0, index);
  return true;
}

}  // namespace gw::data
