// Unit: CRC32C — known vectors (RFC 3720's iSCSI vectors and the usual check value),
// extending and combining, and the hardware path against the portable one.
#include "gradwire/nn/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace gw::nn {
namespace {

using crc32c_internal::ExtendPortable;
using Extend = uint32_t (*)(uint32_t, const void*, size_t);

uint32_t Of(const std::string& s) { return Crc32c(s.data(), s.size()); }

// The hardware implementations this CPU can run.
std::vector<std::pair<std::string, Extend>> HardwareImplementations() {
  std::vector<std::pair<std::string, Extend>> out;
  if (crc32c_internal::HasSse42()) out.emplace_back("sse4.2", &crc32c_internal::ExtendSse42);
  if (crc32c_internal::HasSse42() && crc32c_internal::HasAvx512Clmul()) {
    out.emplace_back("avx512 vpclmulqdq", &crc32c_internal::ExtendAvx512Clmul);
  }
  return out;
}

// Every implementation this CPU can run, so the vectors check each of them.
std::vector<std::pair<std::string, Extend>> Implementations() {
  std::vector<std::pair<std::string, Extend>> out = {{"dispatch", &Crc32cExtend}, {"portable", &ExtendPortable}};
  for (const auto& hardware : HardwareImplementations()) out.push_back(hardware);
  return out;
}

TEST(Crc32cTest, KnownVectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  // An iSCSI read command PDU (RFC 3720, B.4).
  const unsigned char iscsi[48] = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                   0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
                                   0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
                                   0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  for (const auto& [name, extend] : Implementations()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(extend(0, "123456789", 9), 0xE3069283u);
    EXPECT_EQ(extend(0, "", 0), 0u);
    EXPECT_EQ(extend(0, "a", 1), 0xC1D04330u);
    EXPECT_EQ(extend(0, zeros.data(), 32), 0x8A9136AAu);
    EXPECT_EQ(extend(0, ones.data(), 32), 0x62A8AB43u);
    EXPECT_EQ(extend(0, ascending.data(), 32), 0x46DD794Eu);
    EXPECT_EQ(extend(0, descending.data(), 32), 0x113FDB5Cu);
    EXPECT_EQ(extend(0, iscsi, sizeof(iscsi)), 0xD9963A56u);
  }
  EXPECT_EQ(Of("The quick brown fox jumps over the lazy dog"), 0x22620404u);
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(gen());
  return s;
}

TEST(Crc32cTest, ExtendAndCombineEqualTheWholeBuffer) {
  const std::string data = RandomBytes(100000, 1);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{255}, size_t{768}, size_t{24576},
                     size_t{50001}, data.size()}) {
    const uint32_t a = Crc32c(data.data(), cut);
    const uint32_t b = Crc32c(data.data() + cut, data.size() - cut);
    EXPECT_EQ(Crc32cExtend(a, data.data() + cut, data.size() - cut), whole) << cut;
    EXPECT_EQ(Crc32cCombine(a, b, data.size() - cut), whole) << cut;
  }
  // Byte by byte.
  uint32_t crc = 0;
  for (char c : data.substr(0, 1000)) crc = Crc32cExtend(crc, &c, 1);
  EXPECT_EQ(crc, Crc32c(data.data(), 1000));
}

// Lengths around every boundary of the hardware paths (8-byte words; the 256-byte rounds
// and 64-byte steps of folding; 3 x 256-byte and 3 x 8192-byte rounds of three streams)
// at every alignment, and long buffers of random lengths: the same CRC as the portable
// loop, from any starting CRC.
TEST(Crc32cTest, HardwareEqualsPortableAtEveryLengthAndAlignment) {
  if (HardwareImplementations().empty()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  const std::string data = RandomBytes(3 * 8192 * 3 + 64, 2);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 600; ++n) lengths.push_back(n);
  for (size_t base : {size_t{768}, size_t{1536}, size_t{24576}, size_t{49152}, size_t{73728}}) {
    for (size_t d = 0; d <= 70; ++d) {
      lengths.push_back(base + d);
      lengths.push_back(base - d);
    }
  }
  std::mt19937_64 gen(3);
  for (int i = 0; i < 200; ++i) lengths.push_back(gen() % (data.size() - 8));
  for (const auto& [name, extend] : HardwareImplementations()) {
    SCOPED_TRACE(name);
    for (size_t offset = 0; offset < 8; ++offset) {
      for (size_t n : lengths) {
        if (offset + n > data.size()) continue;
        const char* p = data.data() + offset;
        ASSERT_EQ(extend(0, p, n), ExtendPortable(0, p, n)) << "offset " << offset << " length " << n;
        ASSERT_EQ(extend(0x12345678, p, n), ExtendPortable(0x12345678, p, n)) << offset << " " << n;
      }
    }
  }
}

}  // namespace
}  // namespace gw::nn
