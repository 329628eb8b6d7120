// Internal: the names of the parameter server's functions (server.cc, client.cc).
#ifndef GRADWIRE_PARAM_SERVER_SRC_WIRE_H_
#define GRADWIRE_PARAM_SERVER_SRC_WIRE_H_

#include "absl/status/statusor.h"
#include "gradwire/dist_autograd/optimizer_value.h"
#include "gradwire/param_server/row_store.h"

namespace gw::param_server {

// (table, shard values, optimizer, consistency, trainers, timeout_ms, staleness)
inline constexpr char kCreateFn[] = "__ps.create";
inline constexpr char kPullFn[] = "__ps.pull";      // (table, clock) -> shard values
inline constexpr char kPushFn[] = "__ps.push";      // (table, clock, trainer, shard gradient)
// ([table], clock, trainer, [shard gradient]) -> [shard values as of clock + 1]
inline constexpr char kPushPullManyFn[] = "__ps.push_pull_many";
// (table, layout, optimizer, consistency, trainers, timeout_ms, staleness)
inline constexpr char kCreateSparseFn[] = "__ps.create_sparse";
inline constexpr char kPullRowsFn[] = "__ps.pull_rows";  // (table, clock, ids int64 [n]) -> rows [n, dim]
inline constexpr char kPushRowsFn[] = "__ps.push_rows";  // (table, clock, trainer, ids, gradient rows)
inline constexpr char kCheckpointFn[] = "__ps.checkpoint";  // () -> path of the checkpoint written
inline constexpr char kShardRRefFn[] = "__ps.shard_rref";    // (table) -> RRef<Tensor> of this server's shard

// A sparse table's shape on the wire: {"dim", "capacity", "init", "a", "b", "seed"}.
struct SparseLayout {
  int64_t dim = 0;
  int64_t capacity = 0;
  RowInit init;
};

inline rpc::Value LayoutToValue(const SparseLayout& l) {
  return rpc::Value(rpc::ValueMap{{"dim", rpc::Value(l.dim)},
                                  {"capacity", rpc::Value(l.capacity)},
                                  {"init", rpc::Value(static_cast<int64_t>(l.init.kind))},
                                  {"a", rpc::Value(l.init.a)},
                                  {"b", rpc::Value(l.init.b)},
                                  {"seed", rpc::Value(static_cast<int64_t>(l.init.seed))}});
}

inline absl::StatusOr<SparseLayout> LayoutFromValue(const rpc::Value& v) {
  if (!v.is<rpc::ValueMap>()) return absl::InvalidArgumentError("sparse layout must be a map");
  const rpc::ValueMap& m = v.get<rpc::ValueMap>();
  auto get = [&](const char* key, auto* out) -> bool {
    auto it = m.find(key);
    using T = std::remove_pointer_t<decltype(out)>;
    if (it == m.end() || !it->second.is<T>()) return false;
    *out = it->second.get<T>();
    return true;
  };
  SparseLayout l;
  int64_t kind = 0, seed = 0;
  if (!get("dim", &l.dim) || !get("capacity", &l.capacity) || !get("init", &kind) || !get("a", &l.init.a) ||
      !get("b", &l.init.b) || !get("seed", &seed)) {
    return absl::InvalidArgumentError("sparse layout lacks dim, capacity, init, a, b or seed");
  }
  l.init.kind = static_cast<RowInit::Kind>(kind);
  l.init.seed = static_cast<uint64_t>(seed);
  return l;
}

using dist_autograd::ConfigFromValue;
using dist_autograd::ConfigToValue;

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_SRC_WIRE_H_
