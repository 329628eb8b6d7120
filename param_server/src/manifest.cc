#include "manifest.h"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "absl/strings/str_cat.h"
#include "gradwire/nn/crc32c.h"
#include "nlohmann/json.hpp"

namespace gw::param_server::internal {
namespace {

using nlohmann::json;

constexpr char kFormat[] = "gradwire checkpoint 1";
constexpr char kCrcLine[] = "crc32c ";

std::string Hex(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

}  // namespace

const ManifestFile* Manifest::FileOf(const std::string& server) const {
  auto it = std::find_if(files.begin(), files.end(), [&](const ManifestFile& f) { return f.server == server; });
  return it == files.end() ? nullptr : &*it;
}

const ManifestTable* Manifest::Table(const std::string& name) const {
  auto it = std::find_if(tables.begin(), tables.end(), [&](const ManifestTable& t) { return t.name == name; });
  return it == tables.end() ? nullptr : &*it;
}

std::string Encode(const Manifest& m) {
  json files = json::array();
  for (const ManifestFile& f : m.files) {
    json shards = json::array();
    for (const ManifestShard& s : f.shards) {
      shards.push_back({{"table", s.table}, {"kind", s.sparse ? "sparse" : "dense"}, {"consistency", s.consistency},
                        {"epoch", s.epoch}, {"size", s.size}, {"clock", s.clock}, {"updates", s.updates}});
    }
    files.push_back({{"server", f.server}, {"name", f.name}, {"bytes", f.bytes}, {"crc32c", Hex(f.crc32c)},
                     {"shards", shards}});
  }
  json tables = json::array();
  for (const ManifestTable& t : m.tables) {
    tables.push_back({{"name", t.name}, {"kind", t.sparse ? "sparse" : "dense"}, {"shape", t.shape}, {"dim", t.dim},
                      {"epoch", t.epoch}, {"servers", t.servers}, {"begins", t.begins}, {"ends", t.ends}});
  }
  const json doc = {{"format", kFormat},         {"job", m.job},     {"version", m.version},
                    {"step", m.step},             {"written_at", m.written_at}, {"files", files},
                    {"tables", tables},           {"shared_directory", m.shared_directory}};
  // Names that are not UTF-8 are replaced, not thrown on (dump's default).
  std::string text = doc.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
  return absl::StrCat(text, kCrcLine, Hex(nn::Crc32c(text.data(), text.size())), "\n");
}

absl::StatusOr<Manifest> Decode(const std::string& text, const std::string& path) {
  auto damaged = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest '", path, "' is damaged: ", what));
  };
  // The last line is the checksum of everything before it.
  const size_t last = text.size() >= 2 ? text.rfind('\n', text.size() - 2) : std::string::npos;
  if (last == std::string::npos || text.back() != '\n' || text.compare(last + 1, 7, kCrcLine) != 0) {
    return damaged("no checksum line at its end (incomplete or not a manifest)");
  }
  const std::string body = text.substr(0, last + 1);
  const std::string stored = text.substr(last + 1 + 7, text.size() - last - 1 - 7 - 1);
  const std::string computed = Hex(nn::Crc32c(body.data(), body.size()));
  if (stored != computed) return damaged(absl::StrCat("checksum ", stored, " stored, ", computed, " computed"));
  try {
    const json doc = json::parse(body);
    if (doc.at("format").get<std::string>() != kFormat) return damaged("unknown format");
    Manifest m;
    m.job = doc.at("job").get<std::string>();
    m.version = doc.at("version").get<int64_t>();
    m.step = doc.at("step").get<int64_t>();
    m.written_at = doc.at("written_at").get<std::string>();
    m.shared_directory = doc.at("shared_directory").get<bool>();
    for (const json& f : doc.at("files")) {
      ManifestFile file;
      file.server = f.at("server").get<std::string>();
      file.name = f.at("name").get<std::string>();
      file.bytes = f.at("bytes").get<uint64_t>();
      file.crc32c = static_cast<uint32_t>(std::stoul(f.at("crc32c").get<std::string>(), nullptr, 16));
      if (file.name.empty() || file.name.find('/') != std::string::npos || file.name[0] == '.') {
        return damaged(absl::StrCat("bad file name '", file.name, "'"));
      }
      for (const json& s : f.at("shards")) {
        file.shards.push_back({s.at("table").get<std::string>(), s.at("kind").get<std::string>() == "sparse",
                               s.at("consistency").get<int>(), s.at("epoch").get<int64_t>(),
                               s.at("size").get<int64_t>(), s.at("clock").get<int64_t>(),
                               s.at("updates").get<int64_t>()});
      }
      m.files.push_back(std::move(file));
    }
    for (const json& t : doc.at("tables")) {
      ManifestTable table;
      table.name = t.at("name").get<std::string>();
      table.sparse = t.at("kind").get<std::string>() == "sparse";
      table.shape = t.at("shape").get<std::vector<int64_t>>();
      table.dim = t.at("dim").get<int64_t>();
      table.epoch = t.at("epoch").get<int64_t>();
      table.servers = t.at("servers").get<std::vector<std::string>>();
      table.begins = t.at("begins").get<std::vector<int64_t>>();
      table.ends = t.at("ends").get<std::vector<int64_t>>();
      if (!table.sparse && (table.begins.size() != table.servers.size() || table.ends.size() != table.servers.size())) {
        return damaged(absl::StrCat("table '", table.name, "' has ", table.servers.size(), " servers but ",
                                    table.begins.size(), " key ranges"));
      }
      m.tables.push_back(std::move(table));
    }
    return m;
  } catch (const std::exception& e) {
    return damaged(e.what());
  }
}

}  // namespace gw::param_server::internal
