// Named-tensor files: the on-disk format of state dicts and checkpoints.
//
// Format (all integers little-endian):
//   magic "GWTF" | u32 version (=1) | u64 count
//   count x { u32 name_len | name bytes | u8 dtype (DType value) | u8 ndim |
//             i64 sizes[ndim] | u64 nbytes | nbytes of row-major element data }
//
// Contract
//   - SaveTensors writes to "<path>.tmp", fsyncs and renames over `path`, so a reader
//     sees either the old file or the complete new one, never a torn write.
//   - LoadTensors validates every length against the bytes that remain and against
//     limits (name <= 4096 bytes, ndim <= 16, nbytes == numel * element size) before
//     allocating; a corrupt or truncated file is an error naming the path and the entry,
//     never a crash. A file that cannot be read is a Status naming the path, with the
//     system's reason as its code (NOT_FOUND, PERMISSION_DENIED, ...; a directory:
//     FAILED_PRECONDITION), never an exception.
#ifndef GRADWIRE_NN_SERIALIZE_H_
#define GRADWIRE_NN_SERIALIZE_H_

#include <string>

#include "absl/status/statusor.h"
#include "gradwire/nn/module.h"

namespace gw::nn {

absl::Status SaveTensors(const std::string& path, const NamedTensors& tensors);
absl::StatusOr<NamedTensors> LoadTensors(const std::string& path);

}  // namespace gw::nn

#endif  // GRADWIRE_NN_SERIALIZE_H_
