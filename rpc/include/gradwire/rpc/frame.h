// Frames: how one message is laid out on a byte stream, and the checked decoder.
//
// A Message is an opaque header (the serialized protobuf Envelope) plus tensors. On the
// wire (all integers little-endian):
//
//   magic u32 'GWFR' | version u16 (=1) | num_tensors u16 | header_len u32 |
//   descriptor_len u32 | payload_len u64                                   (24 bytes)
//   num_tensors descriptors: dtype u8 | ndim u8 | reserved u16 | reserved u32 |
//                            sizes i64[ndim]
//   header bytes
//   tensor data, each tensor contiguous and row-major, in descriptor order
//
// Contract
//   - FrameDecoder checks every length against FrameLimits and against the other lengths
//     *before* allocating: header_len, num_tensors, ndim, sizes, and payload_len must
//     equal the sum of the tensors' bytes. Any violation is an error Status (and the
//     caller closes the connection); no input crashes it or makes it allocate more than
//     the limits allow (the libFuzzer target rpc/tests/frame_fuzzer.cc checks this).
//   - Tensor payloads are read straight into freshly allocated tensor storage:
//     NextBuffer() points into it, so a transport can recv() into it without a copy.
//   - EncodeFrame produces the 24-byte prefix + descriptors + header as one string and
//     the tensors' contiguous buffers as separate spans (scatter-gather, no copy of
//     tensor data unless a tensor was not contiguous).
//   - Not thread-safe; one decoder per connection.
#ifndef GRADWIRE_RPC_FRAME_H_
#define GRADWIRE_RPC_FRAME_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gradwire/tensor/tensor.h"

namespace gw::rpc {

struct Message {
  std::string header;
  std::vector<Tensor> tensors;
};

struct FrameLimits {
  uint32_t max_header_bytes = 64u << 20;
  uint16_t max_tensors = 4096;
  uint8_t max_dims = 16;
  uint64_t max_payload_bytes = uint64_t{4} << 30;
};

inline constexpr uint32_t kFrameMagic = 0x52465747;  // "GWFR" little-endian
inline constexpr uint16_t kFrameVersion = 1;
inline constexpr size_t kFramePrefixBytes = 24;

struct EncodedFrame {
  std::string prefix;                         // fixed header + descriptors + header bytes
  std::vector<Tensor> tensors;                // contiguous versions of the message's tensors
  std::vector<absl::Span<const char>> spans;  // their bytes, in order
  size_t total_bytes() const;
  // Replaces every tensor that someone else still references by a private copy, so the
  // frame's bytes no longer change when the caller modifies its tensors after sending.
  void Snapshot();
};

// REQUIRES: every tensor is defined and on the CPU; the message fits the limits.
absl::StatusOr<EncodedFrame> EncodeFrame(const Message& message, const FrameLimits& limits = {});

class FrameDecoder {
 public:
  explicit FrameDecoder(FrameLimits limits = {});

  // Where the next bytes of the stream belong (never empty while no error occurred).
  absl::Span<char> NextBuffer();
  // Records that n bytes (n <= NextBuffer().size()) were written into NextBuffer().
  absl::Status Advance(size_t n);
  // Copies as much of data as the current message needs; returns bytes consumed, which
  // is less than data.size() when a message completed (take it, then call again).
  absl::StatusOr<size_t> Consume(absl::Span<const char> data);

  bool HasMessage() const { return state_ == State::kDone; }
  // REQUIRES: HasMessage(). Resets the decoder for the next frame.
  Message TakeMessage();
  // Bytes of tensor payload still expected for the current frame (for transports that
  // read large payloads directly instead of through a staging buffer).
  uint64_t payload_remaining() const;

 private:
  enum class State { kPrefix, kDescriptors, kHeader, kPayload, kDone, kError };

  absl::Status Fail(std::string message);
  absl::Status OnPrefix();
  absl::Status OnDescriptors();
  void StartPayload();

  const FrameLimits limits_;
  State state_ = State::kPrefix;
  std::string scratch_;  // prefix and descriptors
  size_t filled_ = 0;    // bytes of the current section received
  uint16_t num_tensors_ = 0;
  uint32_t header_len_ = 0;
  uint32_t descriptor_len_ = 0;
  uint64_t payload_len_ = 0;
  uint64_t payload_done_ = 0;
  Message message_;
  size_t tensor_index_ = 0;
  size_t tensor_filled_ = 0;
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_FRAME_H_
