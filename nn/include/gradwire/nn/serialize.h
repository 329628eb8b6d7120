// Named-tensor files: the on-disk format of state dicts and checkpoints.
//
// Format, version 2 (all integers little-endian; CRC = CRC32C of crc32c.h):
//   header:  magic "GWTF" | u32 version (=2) | u64 count
//   count x  entry: u32 name_len | name bytes | u8 dtype (DType value) | u8 ndim |
//                   i64 sizes[ndim] | u64 nbytes | nbytes of row-major element data
//            u32 CRC of that entry's bytes (its metadata and payload, from name_len on)
//   trailer: u64 length of everything before the trailer | u32 the file's CRC: of the
//            header and every entry's bytes, not of the entry CRCs between them (a CRC
//            right after the bytes it covers cancels them: CRC(x | CRC(x)) is a constant,
//            so a CRC over all the bytes would depend on the entries' lengths only)
// Version 1 is the same without the entry CRCs and the trailer.
//
// Contract
//   - SaveTensors always writes version 2. It writes to "<path>.tmp", fsyncs, renames over
//     `path` and fsyncs the directory, so a reader sees either the old file or the complete
//     new one, never a torn write, and the rename survives a crash once it returns OK. It
//     reads each payload once, for its entry's CRC (the whole-file CRC is combined from the
//     entries' CRCs, not computed over the bytes again), and hands the payloads to writev
//     from the tensors' memory, uncopied.
//   - LoadTensors validates every length against the bytes that remain and against
//     limits (name <= 4096 bytes, ndim <= 16, nbytes == numel * element size) before
//     allocating. In a version 2 file it checks every entry's CRC and the trailer (its
//     length, then the whole-file CRC), so truncation, appended bytes and a flipped bit
//     anywhere are detected. Version 1 files are still read, unchecked (they have no
//     checksums). A corrupt, truncated or damaged file is DATA_LOSS naming the path and the
//     entry, never a crash.
//   - Float32 and float64 entries holding NaN or an infinity are refused (DATA_LOSS naming
//     the path, the entry, the first such index and value) unless
//     LoadOptions::allow_non_finite: a state dict of NaN weights is almost always the
//     product of a diverged run, not something to serve or resume from.
//   - FileDigest is a file's size and its CRC: for a version 2 file the trailer's (of its
//     contents), for a version 1 file the CRC32C of all its bytes. SaveTensors reports it
//     for the file it wrote at no extra pass; DigestFile reads a file, checks it as
//     LoadTensors does (but for non-finite values) and returns it. Checkpoint manifests
//     record digests so that a file swapped for another whole, valid one is caught too.
//   - Every failure is a Status naming the path, never an exception. A file that cannot be
//     read has the system's reason as its code (NOT_FOUND, PERMISSION_DENIED, ...; a
//     directory: FAILED_PRECONDITION); so does a file that cannot be written.
#ifndef GRADWIRE_NN_SERIALIZE_H_
#define GRADWIRE_NN_SERIALIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gradwire/nn/module.h"

namespace gw::nn {

struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // the file's CRC32C (of its contents: see above)
  friend bool operator==(const FileDigest&, const FileDigest&) = default;
};

struct LoadOptions {
  // Accept NaN and infinities in float32 / float64 entries.
  bool allow_non_finite = false;
};

// `digest`, when given, receives the digest of the file as written.
absl::Status SaveTensors(const std::string& path, const NamedTensors& tensors, FileDigest* digest = nullptr);
absl::StatusOr<NamedTensors> LoadTensors(const std::string& path, const LoadOptions& options = {});
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

}  // namespace gw::nn

#endif  // GRADWIRE_NN_SERIALIZE_H_
