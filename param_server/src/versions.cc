#include "versions.h"


#include <algorithm>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gradwire/nn/file_io.h"
#include "gradwire/nn/serialize.h"

namespace gw::param_server::internal {
namespace fs = std::filesystem;

std::string VersionPath(const std::string& dir, int64_t version) {
  return absl::StrFormat("%s/v%08d", dir, version);
}

std::vector<int64_t> ListVersions(const std::string& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t v = 0;
    // Only names VersionPath makes ("v" and 8 or more digits): "v12" or "v+12" would list
    // a version twice.
    if (name.size() >= 9 && name[0] == 'v' &&
        std::all_of(name.begin() + 1, name.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        absl::SimpleAtoi(name.substr(1), &v) && absl::StrFormat("v%08d", v) == name && it->is_directory(ec)) {
      out.push_back(v);
    }
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

absl::StatusOr<Manifest> ReadManifest(const std::string& version_dir) {
  const std::string path = absl::StrCat(version_dir, "/", kManifestName);
  absl::StatusOr<std::string> text = nn::ReadWholeFile(path, "checkpoint manifest");
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat("'", path, "' does not exist (an incomplete version)"));
  }
  if (!text.ok()) return text.status();
  return Decode(*text, path);
}

absl::Status CheckVersion(const std::string& version_dir, const Manifest& manifest, CheckScope scope,
                          const std::string& server) {
  if (!server.empty() && manifest.FileOf(server) == nullptr) {
    std::vector<std::string> servers;
    for (const ManifestFile& f : manifest.files) servers.push_back(f.server);
    return absl::FailedPreconditionError(absl::StrCat(
        version_dir, " was written by ", absl::StrJoin(servers, ", "), ", and ", server,
        " is not one of them: restart the job with the servers that wrote it (a job cannot yet be restored onto "
        "other servers)"));
  }
  for (const ManifestFile& f : manifest.files) {
    const std::string path = absl::StrCat(version_dir, "/", f.name);
    std::error_code ec;
    if (scope == CheckScope::kPresent && f.server != server && !fs::exists(path, ec)) continue;
    absl::StatusOr<nn::FileDigest> digest = nn::DigestFile(path);
    if (!digest.ok()) return digest.status();
    if (digest->bytes != f.bytes || digest->crc32c != f.crc32c) {
      return absl::DataLossError(absl::StrFormat(
          "'%s' is not the file its version's manifest lists (%d bytes, crc32c %08x; the manifest: %d bytes, "
          "crc32c %08x): it is damaged or from another version",
          path, digest->bytes, digest->crc32c, f.bytes, f.crc32c));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<UsableVersion> NewestUsable(const std::string& dir, const std::string& server,
                                           const std::function<absl::Status(const UsableVersion&)>& load,
                                           const std::function<void(const std::string&, const absl::Status&)>& on_skip) {
  const std::vector<int64_t> versions = ListVersions(dir);
  if (versions.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint version in '", dir, "'"));
  std::vector<std::string> why;
  bool newer_complete = false;  // an incomplete version older than a complete one is not worth a word
  bool any_manifest = false;    // versions that are all cut short hold nothing to restore
  for (int64_t v : versions) {
    const std::string path = VersionPath(dir, v);
    absl::StatusOr<Manifest> manifest = ReadManifest(path);
    absl::Status s = manifest.status();
    any_manifest = any_manifest || !absl::IsNotFound(s);
    if (s.ok() && manifest->version != v) {
      s = absl::DataLossError(absl::StrCat(path, "'s manifest is of version ", manifest->version));
    }
    // In a shared directory every file must be there: servers that each took the newest
    // version whose files they see would restore different versions.
    if (s.ok()) s = CheckVersion(path, *manifest, manifest->shared_directory ? CheckScope::kAll : CheckScope::kPresent, server);
    if (s.ok()) {
      UsableVersion usable{*manifest, path};
      s = load(usable);
      if (s.ok()) return usable;
    }
    if (!(newer_complete && absl::IsNotFound(manifest.status()))) {
      on_skip(path, s);
      why.push_back(absl::StrCat(path, ": ", s.message()));
    }
    newer_complete = newer_complete || manifest.ok();
  }
  if (!any_manifest) {
    return absl::NotFoundError(absl::StrCat("no complete checkpoint version in '", dir, "' (",
                                            versions.size(), " cut short: ", absl::StrJoin(why, "; "), ")"));
  }
  return absl::FailedPreconditionError(absl::StrCat("no usable checkpoint version in '", dir,
                                                    "': ", absl::StrJoin(why, "; ")));
}

absl::StatusOr<UsableVersion> NewestComplete(const std::string& dir) {
  const std::vector<int64_t> versions = ListVersions(dir);
  if (versions.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint version in '", dir, "'"));
  std::vector<std::string> why;
  for (int64_t v : versions) {
    const std::string path = VersionPath(dir, v);
    absl::StatusOr<Manifest> manifest = ReadManifest(path);
    absl::Status s = manifest.status();
    if (s.ok()) s = CheckVersion(path, *manifest, CheckScope::kAll);
    if (s.ok()) return UsableVersion{*std::move(manifest), path};
    why.push_back(absl::StrCat(path, ": ", s.message()));
  }
  return absl::FailedPreconditionError(absl::StrCat("no complete checkpoint version in '", dir,
                                                    "': ", absl::StrJoin(why, "; ")));
}

void Prune(const std::string& dir, int keep) {
  int complete = 0;
  std::error_code ec;
  for (int64_t v : ListVersions(dir)) {
    const std::string path = VersionPath(dir, v);
    const bool has_manifest = fs::exists(absl::StrCat(path, "/", kManifestName), ec);
    if (has_manifest && complete < keep) {
      ++complete;
      continue;
    }
    if (!has_manifest && complete == 0) continue;  // newer than every complete one: maybe being written
    // The manifest first: a removal cut short leaves an incomplete version, never a
    // manifest whose files are gone.
    fs::remove(absl::StrCat(path, "/", kManifestName), ec);
    fs::remove_all(path, ec);
  }
}

}  // namespace gw::param_server::internal
