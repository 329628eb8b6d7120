#include "gradwire/nn/embedding.h"

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/function.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {
namespace {

void CheckIds(const char* op, const Tensor& ids, int64_t rows) {
  GW_CHECK(ids.defined() && ids.dtype() == DType::kInt64, op, "ids must be an int64 tensor, got ",
           ids.defined() ? DTypeName(ids.dtype()) : "undefined");
  const Tensor c = kernels::Contiguous(ids);
  const int64_t* p = c.data<int64_t>();
  for (int64_t i = 0; i < c.numel(); ++i) {
    GW_CHECK(p[i] >= 0 && p[i] < rows, op, "id ", p[i], " at position ", i,
             " is out of range for a table of ", rows, " rows");
  }
}

// Bag boundaries [begin, end) for each bag.
std::vector<std::pair<int64_t, int64_t>> Bags(const Tensor& ids, const Tensor& offsets) {
  const int64_t n = ids.numel();
  GW_CHECK(offsets.dtype() == DType::kInt64 && offsets.dim() == 1, "EmbeddingBag",
           "offsets must be a 1-D int64 tensor, got ", DTypeName(offsets.dtype()),
           ShapeToString(offsets.sizes()));
  const std::vector<int64_t> off = offsets.ToVector<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> bags;
  for (size_t b = 0; b < off.size(); ++b) {
    const int64_t end = b + 1 < off.size() ? off[b + 1] : n;
    GW_CHECK(off[b] >= 0 && off[b] <= end && end <= n && (b > 0 || off[0] == 0), "EmbeddingBag",
             "offsets must start at 0, never decrease and stay within the ", n, " ids; bag ", b,
             " spans [", off[b], ", ", end, ")");
    bags.emplace_back(off[b], end);
  }
  return bags;
}

}  // namespace

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator& gen, DType dtype)
    : Module("Embedding") {
  weight_ = RegisterParameter("weight", Tensor::Randn({num_embeddings, dim}, gen, dtype));
}

Tensor Embedding::Forward(const Tensor& ids) {
  CheckIds("Embedding", ids, weight_.size(0));
  Tensor flat = kernels::Reshape(ids, {-1});
  Shape out_shape = ids.sizes();
  out_shape.push_back(weight_.size(1));
  return gw::Reshape(gw::IndexSelect(weight_, 0, flat), out_shape);
}

std::string Embedding::ExtraRepr() const {
  return absl::StrCat(weight_.size(0), ", ", weight_.size(1));
}

Tensor EmbeddingBagLookup(const Tensor& weight, const Tensor& ids, const Tensor& offsets,
                          BagMode mode) {
  GW_CHECK(weight.defined() && weight.dim() == 2, "EmbeddingBag", "weight must be 2-D");
  GW_CHECK(weight.device().is_cpu() && ids.device().is_cpu(), "EmbeddingBag", "weight on ", weight.device().ToString(),
           ", ids on ", ids.device().ToString(), ": EmbeddingBag runs on the CPU so far");
  GW_CHECK(ids.defined() && ids.dim() == 1, "EmbeddingBag", "ids must be 1-D with offsets, got ",
           ids.defined() ? ShapeToString(ids.sizes()) : "undefined");
  CheckIds("EmbeddingBag", ids, weight.size(0));
  const auto bags = Bags(ids, offsets);
  const Tensor idc = kernels::Contiguous(ids);
  const Tensor w = kernels::Contiguous(weight);
  const int64_t dim = weight.size(1);
  Tensor out = Tensor::Zeros({static_cast<int64_t>(bags.size()), dim}, weight.dtype());
  const int64_t* id = idc.data<int64_t>();
  auto run = [&]<typename T>() {
    const T* pw = w.data<T>();
    T* po = out.data<T>();
    for (size_t b = 0; b < bags.size(); ++b) {
      T* row = po + static_cast<int64_t>(b) * dim;
      for (int64_t j = bags[b].first; j < bags[b].second; ++j) {
        const T* src = pw + id[j] * dim;
        for (int64_t k = 0; k < dim; ++k) row[k] += src[k];
      }
      const int64_t count = bags[b].second - bags[b].first;
      if (mode == BagMode::kMean && count > 0) {
        for (int64_t k = 0; k < dim; ++k) row[k] /= static_cast<T>(count);
      }
    }
  };
  if (weight.dtype() == DType::kFloat32) {
    run.operator()<float>();
  } else {
    GW_CHECK(weight.dtype() == DType::kFloat64, "EmbeddingBag", "weight must be floating");
    run.operator()<double>();
  }
  return autograd::Record(
      "EmbeddingBagBackward", {weight}, out,
      [rows = weight.size(0), saved_ids = autograd::SavedTensor(idc), bags,
       mode](const Tensor& g) -> std::vector<Tensor> {
        const Tensor& idc = saved_ids.Get("EmbeddingBagBackward");
        // Scatter each bag's gradient (divided by its size for Mean) into its rows.
        std::vector<int64_t> index;
        std::vector<int64_t> bag_of;
        for (size_t b = 0; b < bags.size(); ++b) {
          for (int64_t j = bags[b].first; j < bags[b].second; ++j) {
            index.push_back(idc.data<int64_t>()[j]);
            bag_of.push_back(static_cast<int64_t>(b));
          }
        }
        Tensor per_id = kernels::IndexSelect(g, 0, Tensor::FromVector<int64_t>(bag_of));
        if (mode == BagMode::kMean) {
          std::vector<double> scale;
          for (int64_t b : bag_of) scale.push_back(1.0 / static_cast<double>(bags[b].second - bags[b].first));
          per_id = kernels::Mul(per_id, kernels::ToDType(Tensor::FromVector<double>(scale, {static_cast<int64_t>(scale.size()), 1}), g.dtype()));
        }
        Tensor gw = Tensor::Zeros({rows, g.size(1)}, g.dtype());
        if (!index.empty()) kernels::IndexAddInPlace(gw, 0, Tensor::FromVector<int64_t>(index), per_id);
        return {gw};
      });
}

EmbeddingBag::EmbeddingBag(int64_t num_embeddings, int64_t dim, BagMode mode, Generator& gen,
                           DType dtype)
    : Module("EmbeddingBag"), mode_(mode) {
  weight_ = RegisterParameter("weight", Tensor::Randn({num_embeddings, dim}, gen, dtype));
}

Tensor EmbeddingBag::Forward(const Tensor& ids) {
  GW_CHECK(ids.defined() && ids.dim() == 2, "EmbeddingBag", "expected ids [B, L], got ",
           ids.defined() ? ShapeToString(ids.sizes()) : "undefined");
  const int64_t b = ids.size(0), l = ids.size(1);
  // Bag i starts at i * l (all bags start at 0 when they are empty).
  Tensor offsets = kernels::MulScalar(Tensor::Arange(0, static_cast<double>(b)), static_cast<double>(l));
  return Forward(kernels::Reshape(ids, {-1}), offsets);
}

Tensor EmbeddingBag::Forward(const Tensor& ids, const Tensor& offsets) {
  return EmbeddingBagLookup(weight_, ids, offsets, mode_);
}

std::string EmbeddingBag::ExtraRepr() const {
  return absl::StrCat(weight_.size(0), ", ", weight_.size(1), ", mode=",
                      mode_ == BagMode::kSum ? "sum" : "mean");
}

}  // namespace gw::nn
