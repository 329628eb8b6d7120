// Checkpoint form of a shard (shard.h): named tensors "<table>|<field>".
//
//   meta         int64 [kMetaSize]: see Meta below
//   init         float64 [2]: RowInit a, b (sparse)
//   opt.d.<f>    float64 scalar: a numeric optimizer hyper-parameter
//   opt.b.<f>    int64 scalar 0/1: a boolean one
//   trainers     int64 [k, 4]: each trainer's index, first and last clock, next clock
//                (elastic trainers; older checkpoints have clocks int64 [trainers], the
//                next clocks of trainers 0 .. trainers-1)
//   pushed       int64 [k] (trainers in the open synchronous step)
//   epoch        int64 scalar: the layout the shard belongs to (re-sharding; older
//                checkpoints have none: 0)
//   dense:  values float32 [n]; state.<buffer> float32 [n]; sum float32 [n] (open step)
//   sparse: ids int64 [rows]; rows float32 [rows, dim * (1 + state size)] (values then
//           state); steps int64 [rows]; sum_ids int64 [k], sum_rows float32 [k, dim]
#include <array>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/tensor/kernels.h"
#include "shard.h"

namespace gw::param_server::internal {
namespace {

enum Meta { kKind, kOptimizer, kConsistency, kTrainers, kTimeoutMs, kStaleness, kApplied, kDim, kCapacity,
            kInitKind, kInitSeed, kStateStep, kMetaSize };
constexpr std::array<const char*, 4> kOptimizerNames = {"SGD", "Adam", "AdamW", "Adagrad"};

Tensor Int64s(const std::vector<int64_t>& v) { return Tensor::FromVector(v, {static_cast<int64_t>(v.size())}); }

std::vector<int64_t> ToInt64s(const Tensor& t) {
  const Tensor c = kernels::Contiguous(t);
  return std::vector<int64_t>(c.data<int64_t>(), c.data<int64_t>() + c.numel());
}

}  // namespace

void Snapshot(const std::string& table, Shard& s, nn::NamedTensors& out, bool open_step) {
  auto put = [&](const std::string& field, Tensor t) { out.emplace_back(absl::StrCat(table, "|", field), std::move(t)); };
  const ShardConfig& c = s.config;
  std::vector<int64_t> meta(kMetaSize, 0);
  meta[kKind] = c.sparse ? 1 : 0;
  const std::string opt_name = optim::Name(c.optimizer);
  for (size_t i = 0; i < kOptimizerNames.size(); ++i) {
    if (opt_name == kOptimizerNames[i]) meta[kOptimizer] = static_cast<int64_t>(i);
  }
  meta[kConsistency] = static_cast<int64_t>(c.consistency);
  meta[kTrainers] = c.trainers;
  meta[kTimeoutMs] = absl::ToInt64Milliseconds(c.sync_timeout);
  meta[kStaleness] = c.staleness;
  meta[kApplied] = s.clock.applied();
  meta[kDim] = c.dim;
  meta[kCapacity] = c.capacity;
  meta[kInitKind] = static_cast<int64_t>(c.init.kind);
  std::memcpy(&meta[kInitSeed], &c.init.seed, sizeof(int64_t));
  meta[kStateStep] = s.state.step;
  put("meta", Int64s(meta));
  put("init", Tensor::FromVector(std::vector<double>{c.init.a, c.init.b}, {2}));
  optim::OptimizerConfig optimizer = c.optimizer;
  optim::ForEachField(optimizer, [&](const char* field, auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, double>) {
      put(absl::StrCat("opt.d.", field), Tensor::Scalar(v, DType::kFloat64));
    } else {
      put(absl::StrCat("opt.b.", field), Tensor::Scalar(v ? 1 : 0, DType::kInt64));
    }
  });
  std::vector<int64_t> trainers;
  for (const auto& [t, span] : s.clock.trainers()) trainers.insert(trainers.end(), {t, span.from, span.until, span.next});
  put("trainers", Tensor::FromVector(trainers, {static_cast<int64_t>(s.clock.trainers().size()), 4}));
  put("pushed", open_step ? Int64s(std::vector<int64_t>(s.clock.pushed().begin(), s.clock.pushed().end()))
                          : Int64s(std::vector<int64_t>{}));
  put("epoch", Tensor::Scalar(static_cast<double>(c.epoch), DType::kInt64));
  if (!c.sparse) {
    put("values", kernels::Clone(s.values));
    for (const auto& [name, buffer] : s.state.buffers) put(absl::StrCat("state.", name), kernels::Clone(buffer));
    if (open_step && !s.pending.empty()) {
      Tensor sum = kernels::Clone(s.pending[0]);
      for (size_t i = 1; i < s.pending.size(); ++i) kernels::AddInPlace(sum, s.pending[i]);
      put("sum", sum);
    }
    return;
  }
  // Rows are gathered into growable buffers: asynchronous pushes (which take only the
  // stripe locks) may add rows while the stripes are visited.
  const int64_t width = c.dim * (1 + optim::RowStateSize(c.optimizer));
  std::vector<int64_t> id_list, step_list;
  std::vector<float> row_list;
  s.rows->Visit([&](uint64_t id, const RowStore::Row& row) {
    id_list.push_back(static_cast<int64_t>(id));
    row_list.insert(row_list.end(), row.values, row.values + width);
    step_list.push_back(*row.step);
  });
  const int64_t n = static_cast<int64_t>(id_list.size());
  Tensor ids = Int64s(id_list), steps = Int64s(step_list), rows = Tensor::Empty({n, width});
  if (n > 0) std::memcpy(rows.data<float>(), row_list.data(), row_list.size() * sizeof(float));
  put("ids", ids);
  put("rows", rows);
  put("steps", steps);
  const int64_t k = open_step ? static_cast<int64_t>(s.row_sum.ids().size()) : 0;
  std::vector<int64_t> sum_ids(s.row_sum.ids().begin(), s.row_sum.ids().begin() + k);
  put("sum_ids", Int64s(sum_ids));
  Tensor sum_rows = Tensor::Empty({k, c.dim});
  if (k > 0) std::memcpy(sum_rows.data<float>(), s.row_sum.values().data(), s.row_sum.values().size() * sizeof(float));
  put("sum_rows", sum_rows);
}

namespace {

absl::StatusOr<std::vector<std::pair<std::string, std::unique_ptr<Shard>>>> RestoreTables(const nn::NamedTensors& in) {
  // Group the fields by table, in file order.
  std::vector<std::string> order;
  std::map<std::string, std::map<std::string, Tensor>> tables;
  for (const auto& [name, t] : in) {
    const size_t bar = name.rfind('|');
    if (bar == std::string::npos) return absl::DataLossError(absl::StrCat("checkpoint entry '", name, "' has no table"));
    const std::string table = name.substr(0, bar);
    if (!tables.contains(table)) order.push_back(table);
    tables[table][name.substr(bar + 1)] = t;
  }
  std::vector<std::pair<std::string, std::unique_ptr<Shard>>> out;
  for (const std::string& table : order) {
    auto& f = tables[table];
    auto need = [&](const std::string& field, DType dtype) -> absl::StatusOr<Tensor> {
      auto it = f.find(field);
      if (it == f.end() || it->second.dtype() != dtype) {
        return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "' lacks a valid '", field, "'"));
      }
      return kernels::Contiguous(it->second);
    };
    absl::StatusOr<Tensor> meta_t = need("meta", DType::kInt64), init_t = need("init", DType::kFloat64);
    if (!meta_t.ok()) return meta_t.status();
    if (!init_t.ok()) return init_t.status();
    const std::vector<int64_t> meta = ToInt64s(*meta_t);
    if (meta.size() != kMetaSize || meta[kOptimizer] < 0 || meta[kOptimizer] >= 4 || meta[kConsistency] < 0 ||
        meta[kConsistency] > 2 || meta[kTrainers] < 1 || meta[kTrainers] > kMaxTrainers || meta[kStaleness] < 0 ||
        meta[kTimeoutMs] < 0 || meta[kApplied] < 0 || meta[kCapacity] < 0 ||
        meta[kCapacity] > StripedRows::kMaxCapacity || meta[kInitKind] < 0 || meta[kInitKind] > 2 ||
        (meta[kKind] == 1 && (meta[kDim] < 1 || meta[kDim] > kMaxRowWidth)) || init_t->numel() != 2) {
      return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "' has a bad header"));
    }
    ShardConfig c;
    std::optional<optim::OptimizerConfig> optimizer =
        optim::DefaultConfig(kOptimizerNames[static_cast<size_t>(meta[kOptimizer])]);
    absl::Status fields;
    optim::ForEachField(*optimizer, [&](const char* field, auto& v) {
      constexpr bool kDouble = std::is_same_v<std::decay_t<decltype(v)>, double>;
      auto it = f.find(absl::StrCat(kDouble ? "opt.d." : "opt.b.", field));
      if (it == f.end()) return;  // the default
      if (it->second.numel() != 1 || it->second.dtype() != (kDouble ? DType::kFloat64 : DType::kInt64)) {
        fields = absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': bad optimizer field ", field));
        return;
      }
      if constexpr (kDouble) {
        v = kernels::Contiguous(it->second).item<double>();
      } else {
        v = kernels::Contiguous(it->second).item<int64_t>() != 0;
      }
    });
    if (!fields.ok()) return fields;
    optim::Validate(*optimizer);  // throws: caught by Restore
    c.optimizer = *optimizer;
    c.sparse = meta[kKind] == 1;
    c.consistency = static_cast<Consistency>(meta[kConsistency]);
    c.trainers = static_cast<int>(meta[kTrainers]);
    c.sync_timeout = absl::Milliseconds(meta[kTimeoutMs]);
    c.staleness = meta[kStaleness];
    if (auto e = f.find("epoch"); e != f.end()) {  // older checkpoints have none: epoch 0
      if (e->second.numel() != 1 || e->second.dtype() != DType::kInt64 || e->second.data<int64_t>()[0] < 0) {
        return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': bad epoch"));
      }
      c.epoch = e->second.data<int64_t>()[0];
    }
    c.dim = meta[kDim];
    c.capacity = meta[kCapacity];
    c.init.kind = static_cast<RowInit::Kind>(meta[kInitKind]);
    std::memcpy(&c.init.seed, &meta[kInitSeed], sizeof(int64_t));
    c.init.a = init_t->data<double>()[0];
    c.init.b = init_t->data<double>()[1];
    if (c.sparse && c.dim * (1 + optim::RowStateSize(c.optimizer)) > RowStore::kMaxWidth) {
      return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': rows too wide"));
    }
    absl::StatusOr<Tensor> values;  // dense: the shard's range
    if (!c.sparse) {
      values = need("values", DType::kFloat32);
      if (!values.ok()) return values.status();
      if (values->dim() != 1) return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': values not 1-D"));
      c.size = values->numel();
    }
    Shard* s = out.emplace_back(table, std::make_unique<Shard>(c)).second.get();
    absl::MutexLock lock(&s->mu);  // not shared yet; for the analysis of its guarded fields
    s->state.step = meta[kStateStep];
    absl::StatusOr<Tensor> pushed = need("pushed", DType::kInt64);
    if (!pushed.ok()) return pushed.status();
    std::map<int, ConsistencyClock::Trainer> trainers;
    if (f.contains("trainers")) {
      absl::StatusOr<Tensor> rows = need("trainers", DType::kInt64);
      if (!rows.ok()) return rows.status();
      const std::vector<int64_t> v = ToInt64s(*rows);
      if (rows->dim() != 2 || rows->size(1) != 4) {
        return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': trainers is not [k, 4]"));
      }
      for (size_t i = 0; i + 3 < v.size(); i += 4) {
        if (v[i] < 0 || v[i] >= kMaxTrainers || v[i + 1] < 0 || v[i + 2] < v[i + 1] - 1) {
          return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': bad trainer ", v[i]));
        }
        trainers[static_cast<int>(v[i])] = {v[i + 1], v[i + 2], v[i + 3]};
      }
    } else {
      absl::StatusOr<Tensor> clocks = need("clocks", DType::kInt64);
      if (!clocks.ok()) return clocks.status();
      std::vector<int64_t> next = ToInt64s(*clocks);
      if (next.size() != static_cast<size_t>(c.trainers)) {
        return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': clocks for ", next.size(),
                                                " trainers, expected ", c.trainers));
      }
      for (int t = 0; t < c.trainers; ++t) trainers[t] = {0, ConsistencyClock::kForever, next[static_cast<size_t>(t)]};
    }
    std::set<int> counted;
    for (int64_t t : ToInt64s(*pushed)) {
      if (!trainers.contains(static_cast<int>(t))) {
        return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': no trainer ", t));
      }
      counted.insert(static_cast<int>(t));
    }
    s->clock.Restore(meta[kApplied], std::move(trainers), std::move(counted));
    if (!c.sparse) {
      s->values = kernels::Clone(*values);
      const Shape shape = values->sizes();
      auto like_values = [&](const Tensor& t) { return t.sizes() == shape && t.dtype() == DType::kFloat32; };
      for (const auto& [field, t] : f) {
        if (!field.starts_with("state.")) continue;
        if (!like_values(t)) return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': bad ", field));
        s->state.buffers[field.substr(6)] = kernels::Clone(t);
      }
      if (f.contains("sum")) {
        if (!like_values(f["sum"])) return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': bad sum"));
        s->pending.push_back(kernels::Clone(f["sum"]));
      }
      continue;
    }
    const int64_t width = c.dim * (1 + optim::RowStateSize(c.optimizer));
    absl::StatusOr<Tensor> ids = need("ids", DType::kInt64), rows = need("rows", DType::kFloat32),
                           steps = need("steps", DType::kInt64), sum_ids = need("sum_ids", DType::kInt64),
                           sum_rows = need("sum_rows", DType::kFloat32);
    for (const auto* t : {&ids, &rows, &steps, &sum_ids, &sum_rows}) {
      if (!t->ok()) return t->status();
    }
    const int64_t n = ids->numel();
    // (More rows than the capacity only evict the oldest again.)
    if (rows->dim() != 2 || rows->size(0) != n || rows->size(1) != width || steps->numel() != n ||
        sum_rows->numel() != sum_ids->numel() * c.dim) {
      return absl::DataLossError(absl::StrCat("checkpoint of table '", table, "': row arrays do not agree"));
    }
    // In file order, so each stripe's LRU order comes back as it was.
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t id = static_cast<uint64_t>(ids->data<int64_t>()[i]);
      s->rows->ForEach(&id, 1, [&](int64_t, const RowStore::Row& row) {
        std::memcpy(row.values, rows->data<float>() + i * width, static_cast<size_t>(width) * sizeof(float));
        *row.step = steps->data<int64_t>()[i];
      });
    }
    s->row_sum.Add(*sum_ids, kernels::Reshape(*sum_rows, {sum_ids->numel(), c.dim}), c.dim);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, std::unique_ptr<Shard>>>> Restore(const nn::NamedTensors& in) {
  // A value the checks above let through makes tensor math throw: a bad file all the same.
  auto tables = rpc::CatchExceptions("checkpoint", [&] { return RestoreTables(in); });
  if (!tables.ok() && tables.status().code() != absl::StatusCode::kDataLoss) {
    return absl::DataLossError(absl::StrCat("checkpoint is inconsistent: ", tables.status().message()));
  }
  return tables;
}

}  // namespace gw::param_server::internal
