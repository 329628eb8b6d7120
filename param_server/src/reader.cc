#include "gradwire/param_server/reader.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/param_server/sharding.h"
#include "messages.h"
#include "shard.h"

namespace gw::param_server {
namespace {

// Joins per-server shards (shards[server][table]) into tables; `shapes` null: steps only.
absl::StatusOr<TablesSnapshot> Join(const std::vector<std::string>& tables, const std::vector<Shape>* shapes,
                                    const std::vector<std::vector<Tensor>>& shards,
                                    const std::vector<std::vector<int64_t>>& steps, const std::string& source) {
  TablesSnapshot out;
  out.oldest = std::numeric_limits<int64_t>::max();
  out.newest = std::numeric_limits<int64_t>::min();
  for (size_t t = 0; t < tables.size(); ++t) {
    int64_t fewest = std::numeric_limits<int64_t>::max();
    for (const std::vector<int64_t>& server : steps) {
      fewest = std::min(fewest, server[t]);
      out.newest = std::max(out.newest, server[t]);
    }
    out.steps.push_back(fewest);
    out.oldest = std::min(out.oldest, fewest);
    if (shapes == nullptr) continue;
    std::vector<Tensor> parts;
    int64_t size = 0;
    for (const std::vector<Tensor>& server : shards) {
      parts.push_back(server[t]);
      size += server[t].numel();
    }
    const Shape& shape = (*shapes)[t];
    if (size != NumElements(shape) || size == 0) {
      return absl::InvalidArgumentError(absl::StrCat("table '", tables[t], "' ", source, " has ", size,
                                                     " values; the shape asked for, ", ShapeToString(shape),
                                                     ", has ", NumElements(shape)));
    }
    out.values.push_back(JoinShards(parts, shape));
  }
  if (tables.empty()) out.oldest = out.newest = 0;
  return out;
}

}  // namespace

Reader::Reader(rpc::Agent& agent, std::vector<std::string> servers, absl::Duration timeout)
    : agent_(agent), servers_(std::move(servers)), timeout_(timeout) {}

Future<TablesSnapshot> Reader::Read(const std::vector<std::string>& tables, const std::vector<Shape>& shapes) const {
  if (shapes.size() != tables.size()) {
    return MakeReadyFuture<TablesSnapshot>(
        agent_.executor(), absl::InvalidArgumentError(absl::StrCat("Read: ", tables.size(), " tables but ",
                                                                   shapes.size(), " shapes")));
  }
  return Ask(tables, &shapes);
}

Future<TablesSnapshot> Reader::Steps(const std::vector<std::string>& tables) const { return Ask(tables, nullptr); }

Future<TablesSnapshot> Reader::Ask(const std::vector<std::string>& tables, const std::vector<Shape>* shapes) const {
  if (servers_.empty()) {
    return MakeReadyFuture<TablesSnapshot>(agent_.executor(),
                                           absl::InvalidArgumentError("a Reader needs at least one server"));
  }
  std::vector<Future<internal::TablesRead>> answers;
  for (const std::string& server : servers_) {
    answers.push_back(agent_.Send(server, internal::ReadMessage{tables, shapes != nullptr}, rpc::CallOptions{timeout_}));
  }
  std::optional<std::vector<Shape>> wanted;
  if (shapes != nullptr) wanted = *shapes;
  return Map<TablesSnapshot>(
      WhenAll(agent_.executor(), std::move(answers)),
      [tables, wanted = std::move(wanted), servers = servers_](
          const absl::StatusOr<std::vector<internal::TablesRead>>& read) -> absl::StatusOr<TablesSnapshot> {
        if (!read.ok()) return read.status();
        std::vector<std::vector<Tensor>> shards;
        std::vector<std::vector<int64_t>> steps;
        for (size_t s = 0; s < read->size(); ++s) {
          const internal::TablesRead& r = (*read)[s];
          if (r.steps.size() != tables.size() || (wanted && r.values.size() != tables.size())) {
            return absl::InternalError(absl::StrCat(servers[s], " answered a read of ", tables.size(),
                                                    " tables with ", r.steps.size(), " steps and ", r.values.size(),
                                                    " values"));
          }
          shards.push_back(r.values);
          steps.push_back(r.steps);
        }
        return Join(tables, wanted ? &*wanted : nullptr, shards, steps, "on the servers");
      });
}

absl::StatusOr<TablesSnapshot> Reader::LoadCheckpoint(const std::vector<std::string>& paths,
                                                      const std::vector<std::string>& tables,
                                                      const std::vector<Shape>& shapes) {
  if (paths.empty()) return absl::InvalidArgumentError("LoadCheckpoint: no checkpoint files (one per server)");
  if (shapes.size() != tables.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadCheckpoint: ", tables.size(), " tables but ", shapes.size(), " shapes"));
  }
  std::vector<std::vector<Tensor>> shards;
  std::vector<std::vector<int64_t>> steps;
  for (const std::string& path : paths) {
    absl::StatusOr<nn::NamedTensors> file = nn::LoadTensors(path);
    if (!file.ok()) return file.status();
    auto restored = internal::Restore(*file);
    if (!restored.ok()) {
      return absl::Status(restored.status().code(),
                          absl::StrCat("checkpoint ", path, ": ", restored.status().message()));
    }
    std::vector<Tensor> values;
    std::vector<int64_t> counts;
    for (const std::string& table : tables) {
      auto it = std::find_if(restored->begin(), restored->end(), [&](const auto& e) { return e.first == table; });
      if (it == restored->end()) {
        return absl::NotFoundError(absl::StrCat("checkpoint ", path, " has no table '", table,
                                                "' (is it one of this job's servers' checkpoints?)"));
      }
      internal::Shard& s = *it->second;
      if (s.config.sparse) {
        return absl::InvalidArgumentError(absl::StrCat("table '", table, "' in ", path, " is sparse"));
      }
      absl::MutexLock lock(&s.mu);
      values.push_back(s.values);
      counts.push_back(s.state.step);
    }
    shards.push_back(std::move(values));
    steps.push_back(std::move(counts));
  }
  return Join(tables, &shapes, shards, steps, "in the checkpoint");
}

}  // namespace gw::param_server
