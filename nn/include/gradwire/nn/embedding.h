// Embedding and EmbeddingBag: lookup tables indexed by int64 ids.
//
// Contract
//   - weight is [num_embeddings, dim], initialised N(0, 1) as in PyTorch.
//   - Embedding::Forward(ids) returns ids.shape + [dim]; its gradient is scattered back
//     into the looked-up rows (IndexAdd, duplicates accumulate).
//   - EmbeddingBag reduces each bag of rows to one vector with Sum or Mean. Bags are given
//     either as a 2-D ids tensor [B, L] (fixed-length bags) or as 1-D ids plus 1-D offsets
//     (bag b is ids[offsets[b] : offsets[b+1]], the last bag runs to the end; offsets
//     start at 0 and never decrease). Empty bags give zeros.
//   - An id outside [0, num_embeddings) is a gw::Error naming the id and the table size.
#ifndef GRADWIRE_NN_EMBEDDING_H_
#define GRADWIRE_NN_EMBEDDING_H_

#include "gradwire/nn/module.h"

namespace gw::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, Generator& gen, DType dtype = DType::kFloat32);
  Tensor Forward(const Tensor& ids) override;
  const Tensor& weight() const { return weight_; }

 protected:
  std::string ExtraRepr() const override;

 private:
  Tensor weight_;
};

enum class BagMode { kSum, kMean };

// The functional form: bags of rows of `weight` reduced by `mode`.
Tensor EmbeddingBagLookup(const Tensor& weight, const Tensor& ids, const Tensor& offsets,
                          BagMode mode);

class EmbeddingBag : public Module {
 public:
  EmbeddingBag(int64_t num_embeddings, int64_t dim, BagMode mode, Generator& gen,
               DType dtype = DType::kFloat32);
  // ids: [B, L] int64.
  Tensor Forward(const Tensor& ids) override;
  // ids: [N] int64, offsets: [B] int64.
  Tensor Forward(const Tensor& ids, const Tensor& offsets);
  const Tensor& weight() const { return weight_; }

 protected:
  std::string ExtraRepr() const override;

 private:
  BagMode mode_;
  Tensor weight_;
};

}  // namespace gw::nn

#endif  // GRADWIRE_NN_EMBEDDING_H_
