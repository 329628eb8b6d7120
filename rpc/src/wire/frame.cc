#include "gradwire/rpc/frame.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gradwire/tensor/kernels.h"

namespace gw::rpc {
namespace {

static_assert(std::endian::native == std::endian::little, "frames are little-endian");

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T Read(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

constexpr size_t kDescriptorFixed = 8;

}  // namespace

size_t EncodedFrame::total_bytes() const {
  size_t n = prefix.size();
  for (const auto& s : spans) n += s.size();
  return n;
}

void EncodedFrame::Snapshot() {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].storage().use_count() == 1 && tensors[i].impl_ptr().use_count() == 1) continue;
    tensors[i] = kernels::Clone(tensors[i]);
    spans[i] = absl::Span<const char>(static_cast<const char*>(tensors[i].raw_data()), tensors[i].nbytes());
  }
}

absl::StatusOr<EncodedFrame> EncodeFrame(const Message& message, const FrameLimits& limits) {
  if (message.header.size() > limits.max_header_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("message header of ", message.header.size(),
                                                   " bytes exceeds the limit of ", limits.max_header_bytes));
  }
  if (message.tensors.size() > limits.max_tensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("message has ", message.tensors.size(), " tensors; the limit is ", limits.max_tensors));
  }
  EncodedFrame f;
  std::string descriptors;
  uint64_t payload = 0;
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const Tensor& t = message.tensors[i];
    if (!t.defined() || t.dim() > limits.max_dims) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " cannot be sent (undefined or more than ",
                                                     static_cast<int>(limits.max_dims), " dims)"));
    }
    Tensor c = kernels::Contiguous(t);
    Put<uint8_t>(&descriptors, static_cast<uint8_t>(c.dtype()));
    Put<uint8_t>(&descriptors, static_cast<uint8_t>(c.dim()));
    Put<uint16_t>(&descriptors, 0);
    Put<uint32_t>(&descriptors, 0);
    for (int64_t d : c.sizes()) Put<int64_t>(&descriptors, d);
    payload += c.nbytes();
    f.spans.emplace_back(static_cast<const char*>(c.raw_data()), c.nbytes());
    f.tensors.push_back(std::move(c));
  }
  if (payload > limits.max_payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("message carries ", payload, " bytes of tensors; the limit is ", limits.max_payload_bytes));
  }
  f.prefix.reserve(kFramePrefixBytes + descriptors.size() + message.header.size());
  Put<uint32_t>(&f.prefix, kFrameMagic);
  Put<uint16_t>(&f.prefix, kFrameVersion);
  Put<uint16_t>(&f.prefix, static_cast<uint16_t>(message.tensors.size()));
  Put<uint32_t>(&f.prefix, static_cast<uint32_t>(message.header.size()));
  Put<uint32_t>(&f.prefix, static_cast<uint32_t>(descriptors.size()));
  Put<uint64_t>(&f.prefix, payload);
  f.prefix += descriptors;
  f.prefix += message.header;
  return f;
}

FrameDecoder::FrameDecoder(FrameLimits limits) : limits_(limits) { scratch_.resize(kFramePrefixBytes); }

absl::Status FrameDecoder::Fail(std::string message) {
  state_ = State::kError;
  return absl::DataLossError(absl::StrCat("malformed frame: ", message));
}

absl::Span<char> FrameDecoder::NextBuffer() {
  switch (state_) {
    case State::kPrefix:
    case State::kDescriptors:
      return absl::Span<char>(scratch_.data() + filled_, scratch_.size() - filled_);
    case State::kHeader:
      return absl::Span<char>(message_.header.data() + filled_, message_.header.size() - filled_);
    case State::kPayload: {
      Tensor& t = message_.tensors[tensor_index_];
      return absl::Span<char>(static_cast<char*>(t.raw_data()) + tensor_filled_, t.nbytes() - tensor_filled_);
    }
    case State::kDone:
    case State::kError:
      return {};
  }
  return {};
}

absl::Status FrameDecoder::Advance(size_t n) {
  if (state_ == State::kError) return absl::DataLossError("malformed frame: decoder already failed");
  if (n > NextBuffer().size()) return Fail("Advance past the buffer");
  if (state_ == State::kPayload) {
    tensor_filled_ += n;
    payload_done_ += n;
    while (state_ == State::kPayload && tensor_filled_ == message_.tensors[tensor_index_].nbytes()) {
      tensor_filled_ = 0;
      if (++tensor_index_ == message_.tensors.size()) state_ = State::kDone;
    }
    return absl::OkStatus();
  }
  filled_ += n;
  switch (state_) {
    case State::kPrefix:
      if (filled_ == kFramePrefixBytes) return OnPrefix();
      break;
    case State::kDescriptors:
      if (filled_ == scratch_.size()) return OnDescriptors();
      break;
    case State::kHeader:
      if (filled_ == message_.header.size()) StartPayload();
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

absl::Status FrameDecoder::OnPrefix() {
  const char* p = scratch_.data();
  if (Read<uint32_t>(p) != kFrameMagic) return Fail("bad magic (not a gradwire peer?)");
  if (Read<uint16_t>(p + 4) != kFrameVersion) {
    return Fail(absl::StrCat("unsupported version ", Read<uint16_t>(p + 4)));
  }
  num_tensors_ = Read<uint16_t>(p + 6);
  header_len_ = Read<uint32_t>(p + 8);
  descriptor_len_ = Read<uint32_t>(p + 12);
  payload_len_ = Read<uint64_t>(p + 16);
  if (num_tensors_ > limits_.max_tensors) {
    return Fail(absl::StrCat(num_tensors_, " tensors exceed the limit of ", limits_.max_tensors));
  }
  if (header_len_ > limits_.max_header_bytes) {
    return Fail(absl::StrCat("header of ", header_len_, " bytes exceeds the limit of ", limits_.max_header_bytes));
  }
  if (payload_len_ > limits_.max_payload_bytes) {
    return Fail(absl::StrCat("payload of ", payload_len_, " bytes exceeds the limit of ", limits_.max_payload_bytes));
  }
  const uint64_t min_desc = uint64_t{num_tensors_} * kDescriptorFixed;
  const uint64_t max_desc = uint64_t{num_tensors_} * (kDescriptorFixed + 8u * limits_.max_dims);
  if (descriptor_len_ < min_desc || descriptor_len_ > max_desc) {
    return Fail(
        absl::StrCat("descriptor block of ", descriptor_len_, " bytes is impossible for ", num_tensors_, " tensors"));
  }
  filled_ = 0;
  if (descriptor_len_ > 0) {
    scratch_.resize(descriptor_len_);
    state_ = State::kDescriptors;
    return absl::OkStatus();
  }
  return OnDescriptors();
}

absl::Status FrameDecoder::OnDescriptors() {
  const char* p = scratch_.data();
  size_t at = 0;
  uint64_t total = 0;
  std::vector<std::pair<DType, Shape>> metas;
  metas.reserve(num_tensors_);
  for (uint16_t i = 0; i < num_tensors_; ++i) {
    if (descriptor_len_ - at < kDescriptorFixed) return Fail("truncated tensor descriptor");
    const uint8_t dtype = Read<uint8_t>(p + at);
    const uint8_t ndim = Read<uint8_t>(p + at + 1);
    at += kDescriptorFixed;
    if (dtype > static_cast<uint8_t>(DType::kBool)) return Fail(absl::StrCat("tensor ", i, ": bad dtype ", int{dtype}));
    if (ndim > limits_.max_dims || descriptor_len_ - at < size_t{8} * ndim) {
      return Fail(absl::StrCat("tensor ", i, ": bad rank ", int{ndim}));
    }
    Shape sizes(ndim);
    bool empty = false;
    for (uint8_t d = 0; d < ndim; ++d) {
      sizes[d] = Read<int64_t>(p + at + 8u * d);
      if (sizes[d] < 0) return Fail(absl::StrCat("tensor ", i, ": negative size"));
      empty |= sizes[d] == 0;
    }
    at += 8u * ndim;
    uint64_t bytes = empty ? 0 : ElementSize(static_cast<DType>(dtype));
    for (uint8_t d = 0; d < ndim && bytes > 0; ++d) {
      // bytes * size must stay within the payload (which also rules out overflow).
      if (bytes > payload_len_ / static_cast<uint64_t>(sizes[d])) {
        return Fail(absl::StrCat("tensor ", i, " is larger than the declared payload"));
      }
      bytes *= static_cast<uint64_t>(sizes[d]);
    }
    if (bytes > payload_len_ - total) return Fail("tensors exceed the declared payload");
    total += bytes;
    metas.emplace_back(static_cast<DType>(dtype), std::move(sizes));
  }
  if (at != descriptor_len_) return Fail("descriptor block has trailing bytes");
  if (total != payload_len_) return Fail("declared payload does not match the tensors");
  message_.tensors.reserve(metas.size());
  for (auto& [dtype, sizes] : metas) message_.tensors.push_back(Tensor::Empty(sizes, dtype));
  message_.header.resize(header_len_);
  filled_ = 0;
  state_ = State::kHeader;
  if (header_len_ == 0) StartPayload();
  return absl::OkStatus();
}

void FrameDecoder::StartPayload() {
  state_ = State::kPayload;
  tensor_index_ = 0;
  tensor_filled_ = 0;
  payload_done_ = 0;
  while (state_ == State::kPayload &&
         (tensor_index_ == message_.tensors.size() || message_.tensors[tensor_index_].nbytes() == 0)) {
    if (tensor_index_ == message_.tensors.size()) {
      state_ = State::kDone;
    } else {
      ++tensor_index_;
    }
  }
}

absl::StatusOr<size_t> FrameDecoder::Consume(absl::Span<const char> data) {
  size_t used = 0;
  while (used < data.size() && state_ != State::kDone) {
    if (state_ == State::kError) return absl::DataLossError("malformed frame: decoder already failed");
    absl::Span<char> dst = NextBuffer();
    const size_t n = std::min(dst.size(), data.size() - used);
    std::memcpy(dst.data(), data.data() + used, n);
    used += n;
    if (absl::Status s = Advance(n); !s.ok()) return s;
  }
  return used;
}

Message FrameDecoder::TakeMessage() {
  Message m = std::move(message_);
  message_ = Message();
  state_ = State::kPrefix;
  scratch_.assign(kFramePrefixBytes, '\0');
  filled_ = 0;
  return m;
}

uint64_t FrameDecoder::payload_remaining() const {
  return state_ == State::kPayload ? payload_len_ - payload_done_ : 0;
}

}  // namespace gw::rpc
