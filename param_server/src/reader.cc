#include "gradwire/param_server/reader.h"

#include <algorithm>
#include <limits>
#include <optional>

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/param_server/sharding.h"
#include "messages.h"
#include "shard.h"
#include "versions.h"

namespace gw::param_server {
namespace {

// Joins each table's shards (shards[table], in shard order, and their update counts) into
// tables; `shapes` null: steps only.
absl::StatusOr<TablesSnapshot> Join(const std::vector<std::string>& tables, const std::vector<Shape>* shapes,
                                    const std::vector<std::vector<Tensor>>& shards,
                                    const std::vector<std::vector<int64_t>>& steps, const std::string& source) {
  TablesSnapshot out;
  out.oldest = std::numeric_limits<int64_t>::max();
  out.newest = std::numeric_limits<int64_t>::min();
  for (size_t t = 0; t < tables.size(); ++t) {
    int64_t fewest = std::numeric_limits<int64_t>::max();
    for (int64_t step : steps[t]) {
      fewest = std::min(fewest, step);
      out.newest = std::max(out.newest, step);
    }
    out.steps.push_back(fewest);
    out.oldest = std::min(out.oldest, fewest);
    if (shapes == nullptr) continue;
    const std::vector<Tensor>& parts = shards[t];
    int64_t size = 0;
    for (const Tensor& part : parts) size += part.numel();
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
        std::vector<std::vector<Tensor>> shards(tables.size());  // [table][server]
        std::vector<std::vector<int64_t>> steps(tables.size());
        for (size_t s = 0; s < read->size(); ++s) {
          const internal::TablesRead& r = (*read)[s];
          if (r.steps.size() != tables.size() || (wanted && r.values.size() != tables.size())) {
            return absl::InternalError(absl::StrCat(servers[s], " answered a read of ", tables.size(),
                                                    " tables with ", r.steps.size(), " steps and ", r.values.size(),
                                                    " values"));
          }
          for (size_t t = 0; t < tables.size(); ++t) {
            if (wanted) shards[t].push_back(r.values[t]);
            steps[t].push_back(r.steps[t]);
          }
        }
        return Join(tables, wanted ? &*wanted : nullptr, shards, steps, "on the servers");
      });
}

absl::StatusOr<TablesSnapshot> Reader::LoadCheckpoint(const std::string& path, const std::vector<std::string>& tables,
                                                      const std::vector<Shape>& shapes) {
  if (shapes.size() != tables.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadCheckpoint: ", tables.size(), " tables but ", shapes.size(), " shapes"));
  }
  // One version's directory (it has a manifest), or a checkpoint directory: its newest complete version.
  absl::StatusOr<internal::UsableVersion> version;
  std::error_code ec;  // (a path that cannot be looked at is read as a directory: its error names it)
  if (std::filesystem::exists(absl::StrCat(path, "/", internal::kManifestName), ec)) {
    absl::StatusOr<internal::Manifest> manifest = internal::ReadManifest(path);
    if (!manifest.ok()) return manifest.status();
    if (absl::Status s = internal::CheckVersion(path, *manifest, internal::CheckScope::kAll); !s.ok()) return s;
    version = internal::UsableVersion{*std::move(manifest), path};
  } else {
    version = internal::NewestComplete(path);
  }
  if (!version.ok()) return version.status();
  const internal::Manifest& m = version->manifest;
  const std::string where = absl::StrCat("checkpoint ", version->path, " (version ", m.version, ", step ", m.step, ")");
  // Each server's file, read once and checked against the manifest (file.h: checksums).
  std::map<std::string, std::vector<std::pair<std::string, std::unique_ptr<internal::Shard>>>> files;
  std::vector<std::vector<Tensor>> shards(tables.size());
  std::vector<std::vector<int64_t>> steps(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const internal::ManifestTable* layout = m.Table(tables[t]);
    if (layout == nullptr) {
      return absl::NotFoundError(absl::StrCat(where, " has no table '", tables[t], "' in its manifest"));
    }
    if (layout->sparse) return absl::InvalidArgumentError(absl::StrCat("table '", tables[t], "' in ", where, " is sparse"));
    for (size_t i = 0; i < layout->servers.size(); ++i) {
      const std::string& server = layout->servers[i];
      const internal::ManifestFile* file = m.FileOf(server);
      if (file == nullptr) {
        return absl::DataLossError(absl::StrCat(where, ": table '", tables[t], "' has a shard on ", server,
                                                ", whose file the manifest does not list"));
      }
      if (!files.contains(server)) {
        const std::string file_path = absl::StrCat(version->path, "/", file->name);
        absl::StatusOr<nn::NamedTensors> loaded = nn::LoadTensors(file_path);
        if (!loaded.ok()) return loaded.status();
        auto restored = internal::Restore(*loaded);
        if (!restored.ok()) {
          return absl::Status(restored.status().code(), absl::StrCat(file_path, ": ", restored.status().message()));
        }
        files[server] = *std::move(restored);
      }
      auto& held = files[server];
      auto it = std::find_if(held.begin(), held.end(), [&](const auto& e) { return e.first == tables[t]; });
      if (it == held.end()) {
        return absl::DataLossError(absl::StrCat(where, ": ", file->name, " has no shard of table '", tables[t], "'"));
      }
      internal::Shard& s = *it->second;
      absl::MutexLock lock(&s.mu);
      if (s.config.sparse || s.config.epoch != layout->epoch || s.values.numel() != layout->ends[i] - layout->begins[i]) {
        return absl::DataLossError(absl::StrCat(where, ": ", file->name, "'s shard of table '", tables[t],
                                                "' is not the one its manifest lists (", s.values.numel(), " keys of layout ",
                                                s.config.epoch, "; the manifest: ", layout->ends[i] - layout->begins[i],
                                                " keys of layout ", layout->epoch, ")"));
      }
      shards[t].push_back(s.values);
      steps[t].push_back(s.state.step);
    }
  }
  return Join(tables, &shapes, shards, steps, absl::StrCat("in ", where));
}

}  // namespace gw::param_server
