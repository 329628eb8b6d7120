// Unit: frame encoding/decoding, and rejection of malformed frames.
#include "gradwire/rpc/frame.h"

#include <gtest/gtest.h>

#include <cstring>

#include "gradwire/tensor/kernels.h"

namespace gw::rpc {
namespace {

std::string Flatten(const EncodedFrame& f) {
  std::string out = f.prefix;
  for (const auto& s : f.spans) out.append(s.data(), s.size());
  return out;
}

Message Sample() {
  Generator gen(1);
  Message m;
  m.header = "envelope bytes";
  m.tensors = {Tensor::Randn({3, 4}, gen), Tensor::Arange(0, 5),
               kernels::Transpose(Tensor::Randn({2, 3}, gen, DType::kFloat64), 0, 1),
               Tensor::Zeros({0, 7}), Tensor::Scalar(3)};
  return m;
}

void ExpectSame(const Message& a, const Message& b) {
  EXPECT_EQ(a.header, b.header);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].dtype(), b.tensors[i].dtype());
    EXPECT_EQ(a.tensors[i].sizes(), b.tensors[i].sizes());
    EXPECT_EQ(a.tensors[i].ToVector<double>(), b.tensors[i].ToVector<double>());
  }
}

TEST(FrameTest, RoundTripThroughAnyChunking) {
  const Message m = Sample();
  const std::string wire = Flatten(*EncodeFrame(m));
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{24}, size_t{100}, wire.size()}) {
    FrameDecoder d;
    size_t at = 0;
    while (!d.HasMessage()) {
      ASSERT_LT(at, wire.size());
      const size_t n = std::min(chunk, wire.size() - at);
      absl::StatusOr<size_t> used = d.Consume(absl::Span<const char>(wire.data() + at, n));
      ASSERT_TRUE(used.ok()) << used.status();
      at += *used;
    }
    EXPECT_EQ(at, wire.size());
    ExpectSame(m, d.TakeMessage());
  }
}

TEST(FrameTest, BackToBackFramesAndDirectPayloadReads) {
  const Message m = Sample();
  const std::string one = Flatten(*EncodeFrame(m));
  const std::string two = one + one;
  FrameDecoder d;
  size_t at = 0;
  int messages = 0;
  while (at < two.size()) {
    // Read like a transport would: straight into NextBuffer().
    absl::Span<char> dst = d.NextBuffer();
    const size_t n = std::min(dst.size(), two.size() - at);
    std::memcpy(dst.data(), two.data() + at, n);
    ASSERT_TRUE(d.Advance(n).ok());
    at += n;
    if (d.HasMessage()) {
      ExpectSame(m, d.TakeMessage());
      ++messages;
    }
  }
  EXPECT_EQ(messages, 2);
}

TEST(FrameTest, MalformedFramesAreRejectedBeforeAllocation) {
  const std::string good = Flatten(*EncodeFrame(Sample()));
  auto decode = [](std::string bytes, FrameLimits limits = {}) {
    FrameDecoder d(limits);
    absl::StatusOr<size_t> r = d.Consume(bytes);
    return r.status();
  };
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_EQ(decode(bad_magic).code(), absl::StatusCode::kDataLoss);
  std::string huge_header = good;
  const uint32_t big = 0x7fffffff;
  std::memcpy(huge_header.data() + 8, &big, 4);
  absl::Status s = decode(huge_header);
  EXPECT_NE(s.message().find("header"), std::string::npos) << s;
  std::string huge_payload = good;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(huge_payload.data() + 16, &huge, 8);
  EXPECT_EQ(decode(huge_payload).code(), absl::StatusCode::kDataLoss);
  // A tensor declared larger than the payload (size field of tensor 0 inflated).
  std::string inflated = good;
  const int64_t dim = int64_t{1} << 40;
  std::memcpy(inflated.data() + kFramePrefixBytes + 8, &dim, 8);
  EXPECT_EQ(decode(inflated).code(), absl::StatusCode::kDataLoss);
  // Limits are enforced.
  EXPECT_EQ(decode(good, FrameLimits{.max_payload_bytes = 10}).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(decode(good, FrameLimits{.max_tensors = 2}).code(), absl::StatusCode::kDataLoss);
  // After an error the decoder stays failed.
  FrameDecoder d;
  EXPECT_FALSE(d.Consume(bad_magic).ok());
  EXPECT_FALSE(d.Consume(good).ok());
}

TEST(FrameTest, RandomBytesNeverCrash) {
  Generator gen(9);
  const std::string good = Flatten(*EncodeFrame(Sample()));
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(gen.NextBelow(8));
    for (int i = 0; i < flips; ++i) {
      bytes[gen.NextBelow(std::min<uint64_t>(bytes.size(), 200))] = static_cast<char>(gen.NextU64());
    }
    FrameDecoder d(FrameLimits{.max_payload_bytes = 1 << 20});
    absl::Span<const char> rest(bytes);
    while (!rest.empty()) {
      absl::StatusOr<size_t> used = d.Consume(rest);
      if (!used.ok()) break;
      rest.remove_prefix(*used);
      if (d.HasMessage()) d.TakeMessage();
    }
  }
}

TEST(FrameTest, EncoderEnforcesLimits) {
  Message m;
  m.header = std::string(100, 'x');
  EXPECT_FALSE(EncodeFrame(m, FrameLimits{.max_header_bytes = 10}).ok());
  m.tensors = {Tensor()};
  EXPECT_FALSE(EncodeFrame(m).ok());
}

}  // namespace
}  // namespace gw::rpc
