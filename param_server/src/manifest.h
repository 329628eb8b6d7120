// Internal: the manifest of one checkpoint version, the record that makes a set of
// server files one cut of one job (server.h, "Checkpoints").
//
// Contract
//   - A Manifest says which job wrote the version, its number, the step of the cut, each
//     server's file (its size and CRC32C, and the shards it holds: table, kind, layout
//     epoch, keys or rows, clock and updates), and for each table the coordinator knew,
//     its shape and layout (its servers in shard order and each one's key range).
//   - Encode writes it as JSON an operator can read, followed by one line
//     "crc32c <8 hex digits>" over every byte before that line. Decode checks that line
//     first, then the fields; any damage or missing field is DATA_LOSS naming `path` and
//     what is wrong. Decode(Encode(m)) == m.
//   - Pure functions: no I/O (versions.h reads and writes the files).
#ifndef GRADWIRE_PARAM_SERVER_SRC_MANIFEST_H_
#define GRADWIRE_PARAM_SERVER_SRC_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gw::param_server::internal {

// One table's shard in a server's file.
struct ManifestShard {
  std::string table;
  bool sparse = false;
  int consistency = 0;  // Consistency
  int64_t epoch = 0;    // the layout it belongs to
  int64_t size = 0;     // dense: keys; sparse: rows
  int64_t clock = 0;    // kSync: steps applied; kBoundedStaleness: the furthest trainer's clock
  int64_t updates = 0;  // optimizer steps applied (ParamState::step)
  bool operator==(const ManifestShard&) const = default;
};

struct ManifestFile {
  std::string server;  // worker name
  std::string name;    // file name inside the version's directory
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  std::vector<ManifestShard> shards;
  bool operator==(const ManifestFile&) const = default;
};

// A table's layout as the coordinating client knew it.
struct ManifestTable {
  std::string name;
  bool sparse = false;
  std::vector<int64_t> shape;          // dense
  int64_t dim = 0;                     // sparse: row width
  int64_t epoch = 0;
  std::vector<std::string> servers;    // shard order
  std::vector<int64_t> begins, ends;   // dense: each server's key range [begin, end)
  bool operator==(const ManifestTable&) const = default;
};

struct Manifest {
  std::string job;
  int64_t version = 0;
  int64_t step = 0;  // the synchronous tables' clock at the cut (0 when none is synchronous)
  std::string written_at;  // RFC 3339, for people
  std::vector<ManifestFile> files;
  std::vector<ManifestTable> tables;
  // Every server wrote into the same directory (one host, or a network file system): a
  // version is usable only with every file (versions.h).
  bool shared_directory = false;

  const ManifestFile* FileOf(const std::string& server) const;
  const ManifestTable* Table(const std::string& name) const;
  bool operator==(const Manifest&) const = default;
};

std::string Encode(const Manifest& m);
absl::StatusOr<Manifest> Decode(const std::string& text, const std::string& path);

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_MANIFEST_H_
