#include "resplit.h"

#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "gradwire/param_server/sharding.h"
#include "gradwire/tensor/kernels.h"

namespace gw::param_server::internal {
namespace {

using Fields = std::map<std::string, Tensor>;

Fields ByName(const ShardForm& f) {
  Fields out;
  for (size_t i = 0; i < f.names.size() && i < f.tensors.size(); ++i) out[f.names[i]] = kernels::Contiguous(f.tensors[i]);
  return out;
}

// The fields every new shard takes from the first old one.
bool Shared(const std::string& name, bool sparse) {
  if (sparse) return name != "ids" && name != "rows" && name != "steps" && name != "sum_ids" && name != "sum_rows";
  return name != "values" && name != "sum" && !name.starts_with("state.");
}

absl::Status Lost(const std::string& what) { return absl::DataLossError(absl::StrCat("re-sharding: ", what)); }

}  // namespace

absl::StatusOr<std::vector<ShardForm>> Resplit(const std::vector<ShardForm>& old_forms,
                                               const std::vector<std::string>& new_servers, int64_t new_epoch) {
  if (old_forms.empty() || new_servers.empty()) return Lost("no shards, or no servers to move them to");
  std::vector<Fields> old;
  for (const ShardForm& f : old_forms) old.push_back(ByName(f));
  const bool sparse = old[0].contains("ids");
  std::vector<ShardForm> out(new_servers.size());
  for (ShardForm& f : out) {
    for (const auto& [name, t] : old[0]) {
      if (!Shared(name, sparse) || name == "epoch") continue;
      f.names.push_back(name);
      f.tensors.push_back(t);
    }
    f.names.push_back("epoch");
    f.tensors.push_back(Tensor::Scalar(static_cast<double>(new_epoch), DType::kInt64));
  }
  if (!sparse) {
    for (const Fields& f : old) {
      if (f.contains("sum")) return Lost("a dense shard has an open step (not frozen at rest)");
    }
    // Every per-key field, joined over the old shards and cut for the new ones.
    std::vector<std::string> keyed{"values"};
    for (const auto& [name, _] : old[0]) {
      if (name.starts_with("state.")) keyed.push_back(name);
    }
    for (const std::string& field : keyed) {
      std::vector<Tensor> parts;
      for (const Fields& f : old) {
        auto it = f.find(field);
        if (it == f.end() || it->second.dim() != 1 || it->second.dtype() != DType::kFloat32) {
          return Lost(absl::StrCat("a dense shard lacks '", field, "'"));
        }
        if (it->second.numel() > 0) parts.push_back(it->second);
      }
      const Tensor all = parts.empty() ? Tensor::Empty({0}) : parts.size() == 1 ? parts[0] : kernels::Cat(parts, 0);
      const std::vector<KeyRange> ranges = ShardDense(all.numel(), static_cast<int>(new_servers.size()));
      for (size_t s = 0; s < new_servers.size(); ++s) {
        out[s].names.push_back(field);
        out[s].tensors.push_back(kernels::Clone(kernels::Narrow(all, 0, ranges[s].begin, ranges[s].size())));
      }
    }
    return out;
  }
  // Sparse: every row to the server IdPlacement gives it.
  const IdPlacement placement(new_servers);
  int64_t width = -1;
  std::vector<std::vector<int64_t>> ids(new_servers.size()), steps(new_servers.size());
  std::vector<std::vector<float>> rows(new_servers.size());
  for (const Fields& f : old) {
    auto i = f.find("ids"), r = f.find("rows"), st = f.find("steps"), k = f.find("sum_ids");
    if (i == f.end() || r == f.end() || st == f.end() || r->second.dim() != 2 || i->second.dtype() != DType::kInt64 ||
        st->second.dtype() != DType::kInt64 || r->second.dtype() != DType::kFloat32 ||
        r->second.size(0) != i->second.numel() || st->second.numel() != i->second.numel()) {
      return Lost("a sparse shard's rows do not add up");
    }
    if (k != f.end() && k->second.numel() > 0) return Lost("a sparse shard has an open step (not frozen at rest)");
    if (width < 0) width = r->second.size(1);
    if (r->second.size(1) != width) return Lost("sparse shards of different row widths");
    const int64_t* id = i->second.data<int64_t>();
    const int64_t* step = st->second.data<int64_t>();
    const float* row = r->second.data<float>();
    for (int64_t n = 0; n < i->second.numel(); ++n) {
      const size_t s = static_cast<size_t>(placement.ServerOf(static_cast<uint64_t>(id[n])));
      ids[s].push_back(id[n]);
      steps[s].push_back(step[n]);
      rows[s].insert(rows[s].end(), row + n * width, row + (n + 1) * width);
    }
  }
  const int64_t dim = old[0].contains("sum_rows") && old[0].at("sum_rows").dim() == 2 ? old[0].at("sum_rows").size(1) : 1;
  for (size_t s = 0; s < new_servers.size(); ++s) {
    const int64_t n = static_cast<int64_t>(ids[s].size());
    Tensor r = Tensor::Empty({n, std::max<int64_t>(width, 0)});
    if (n > 0) std::memcpy(r.data<float>(), rows[s].data(), rows[s].size() * sizeof(float));
    out[s].names.insert(out[s].names.end(), {"ids", "rows", "steps", "sum_ids", "sum_rows"});
    out[s].tensors.insert(out[s].tensors.end(), {Tensor::FromVector(ids[s], {n}), r, Tensor::FromVector(steps[s], {n}),
                                                 Tensor::Empty({0}, DType::kInt64), Tensor::Empty({0, dim})});
  }
  return out;
}

}  // namespace gw::param_server::internal
