// safetensors files: the named-tensor format of Hugging Face (github.com/huggingface/safetensors),
// in which PyTorch models are distributed.
//
// Format (integers little-endian):
//   u64 N | N bytes of JSON header | the byte buffer
//   header: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"<key>": "<string value>", ...}}   (__metadata__ optional)
//   Offsets are relative to the start of the buffer; the tensors tile the buffer exactly (no
//   overlaps, no holes, nothing after the last one); each holds its elements row-major.
//
// Contract
//   - SaveSafetensors writes F32, F64, I64 and BOOL tensors as themselves (strided tensors
//     are written contiguous), ordered as the reference implementation orders them (larger
//     elements first, then by name) so that every tensor is aligned to its element size, with
//     the header padded with spaces to a multiple of 8 bytes. The metadata is written as
//     given, plus "gradwire.crc32c": the CRC32C (crc32c.h) of the buffer, 8 lowercase hex
//     digits (a value given for that key is replaced). The write is atomic (file_io.h's
//     WriteFileAtomically). Names must be unique, non-empty, valid UTF-8 and not
//     "__metadata__": otherwise INVALID_ARGUMENT naming the tensor.
//   - LoadSafetensors returns the tensors in the order of their data in the file. F32, F64,
//     I64 and BOOL load as themselves; F16 and BF16 (common in Hugging Face weights) load
//     converted to float32 (exactly: every F16 and BF16 value is a float32 value). Any other
//     dtype is INVALID_ARGUMENT naming the tensor and the dtype. `metadata`, when given,
//     receives __metadata__ (including "gradwire.crc32c" when present).
//   - Integrity: when __metadata__ holds "gradwire.crc32c" the buffer's CRC32C must match
//     it. (A file without that key, such as PyTorch's, loads unchecked, and so does one whose
//     damage renamed the key: the header itself is not checksummed, only validated.) Float values that are NaN or infinite are refused unless
//     LoadOptions::allow_non_finite (as serialize.h's LoadTensors refuses them); BOOL bytes
//     must be 0 or 1. Every malformed file (shorter than 8 bytes, a header length beyond the
//     file or over 100 MB, a header that is not a JSON object or has fields of the wrong
//     type, duplicate names or keys, offsets out of range, overlapping or leaving holes,
//     a byte length other than numel * element size) is DATA_LOSS naming the path and what
//     is wrong, never a crash. A file that cannot be read has the system's code
//     (NOT_FOUND, ...), as file_io.h's ReadWholeFile reports it.
//   - Module::SaveSafetensors / LoadSafetensors (module.h) use these for state dicts.
//   - Thread safety: free functions without shared state; safe from any thread.
#ifndef GRADWIRE_NN_SAFETENSORS_H_
#define GRADWIRE_NN_SAFETENSORS_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradwire/nn/module.h"
#include "gradwire/nn/serialize.h"

namespace gw::nn {

// __metadata__: string keys to string values.
using SafetensorsMetadata = std::map<std::string, std::string>;

// The __metadata__ key under which gradwire records the buffer's CRC32C.
inline constexpr char kSafetensorsCrcKey[] = "gradwire.crc32c";

absl::Status SaveSafetensors(const std::string& path, const NamedTensors& tensors,
                             const SafetensorsMetadata& metadata = {});

absl::StatusOr<NamedTensors> LoadSafetensors(const std::string& path, const LoadOptions& options = {},
                                             SafetensorsMetadata* metadata = nullptr);

}  // namespace gw::nn

#endif  // GRADWIRE_NN_SAFETENSORS_H_
