// Internal: a checkpoint directory of numbered versions (server.h, "Checkpoints"; the
// servers write them, Reader and ServeCheckpoint read them).
//
//   <dir>/v00000012/worker0.gwps   one file per server (nn::SaveTensors, checksummed)
//   <dir>/v00000012/worker1.gwps
//   <dir>/v00000012/MANIFEST       manifest.h, written last: a version without one is
//                                  incomplete (a write was cut short) and never read
//
// Contract
//   - VersionPath(dir, v) names version v's directory; ListVersions(dir) the versions
//     that have one, newest first, complete or not (a missing `dir`: none).
//   - ReadManifest(version_dir): the checked manifest (manifest.h); NOT_FOUND when the
//     version has none (incomplete), DATA_LOSS when it is damaged, naming the path.
//   - CheckVersion(version_dir, manifest, scope, server): every file of the manifest (kAll),
//     or only those present but the named server's, which must be (kPresent: a server whose
//     directory is not shared sees only its own), compared with the manifest: size and
//     CRC32C (nn::DigestFile, which also checks the file). A named server the manifest does
//     not list is FAILED_PRECONDITION saying which servers wrote the version. DATA_LOSS names the file and what
//     differs; a missing file is NOT_FOUND naming it.
//   - NewestUsable(dir, server, load, on_skip): the newest complete version whose manifest
//     is intact, lists `server`, passes CheckVersion (kAll when the manifest says the
//     servers shared the directory, else kPresent) and which load(version)
//     accepts; every newer version passed over is reported to on_skip(version_dir, why)
//     (an incomplete version older than a complete one is passed over silently). NOT_FOUND when the directory holds no
//     version at all, or only incomplete ones (a write cut short before any version was
//     complete: nothing to restore); FAILED_PRECONDITION listing why each failed when none
//     is usable.
//   - NewestComplete(dir): the newest intact version whose files all pass CheckVersion
//     (kAll): for readers.
//   - Prune(dir, keep): removes all but the newest `keep` complete versions, and the
//     incomplete ones older than the newest complete one (a version being written is
//     newer, so it stays). Best effort: what cannot be removed is left.
#ifndef GRADWIRE_PARAM_SERVER_SRC_VERSIONS_H_
#define GRADWIRE_PARAM_SERVER_SRC_VERSIONS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "manifest.h"

namespace gw::param_server::internal {

inline constexpr char kManifestName[] = "MANIFEST";

std::string VersionPath(const std::string& dir, int64_t version);
std::vector<int64_t> ListVersions(const std::string& dir);

absl::StatusOr<Manifest> ReadManifest(const std::string& version_dir);

enum class CheckScope { kAll, kPresent };
absl::Status CheckVersion(const std::string& version_dir, const Manifest& manifest, CheckScope scope,
                          const std::string& server = "");

struct UsableVersion {
  Manifest manifest;
  std::string path;  // the version's directory
};
absl::StatusOr<UsableVersion> NewestUsable(const std::string& dir, const std::string& server,
                                           const std::function<absl::Status(const UsableVersion&)>& load,
                                           const std::function<void(const std::string&, const absl::Status&)>& on_skip);
absl::StatusOr<UsableVersion> NewestComplete(const std::string& dir);

void Prune(const std::string& dir, int keep);

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_VERSIONS_H_
