#include "gradwire/nn/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace gw::nn {
namespace {

// The polynomial, reflected: bit 31 is x^0, bit 0 is x^31. Everything below works on the
// "raw" register, without the initial and final inversions, which Crc32cExtend applies.
constexpr uint32_t kPoly = 0x82F63B78;

// a * b mod P (a and b reflected polynomials of degree < 32).
constexpr uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 31; i >= 0; --i) {
    if ((a >> i) & 1) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;  // b *= x
  }
  return product;
}

// kX8Pow2[k] = x^(8 * 2^k) mod P.
constexpr std::array<uint32_t, 64> MakeX8Pow2() {
  std::array<uint32_t, 64> t{};
  t[0] = 1u << 23;  // x^8
  for (size_t k = 1; k < t.size(); ++k) t[k] = MultModP(t[k - 1], t[k - 1]);
  return t;
}
constexpr std::array<uint32_t, 64> kX8Pow2 = MakeX8Pow2();

// x^(8n) mod P: multiplying a raw register by it feeds it n zero bytes.
constexpr uint32_t XPow8n(uint64_t n) {
  uint32_t result = 1u << 31;  // x^0
  for (size_t k = 0; n != 0; n >>= 1, ++k) {
    if (n & 1) result = MultModP(kX8Pow2[k], result);
  }
  return result;
}

using ByteTables = std::array<std::array<uint32_t, 256>, 8>;

// Slicing-by-8: table[k][b] is the raw CRC of byte b followed by k zero bytes.
constexpr ByteTables MakeSlicingTables() {
  ByteTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}
constexpr ByteTables kSlicing = MakeSlicingTables();

uint32_t Load32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Multiplication of a raw register by x^(8 * bytes) (feeding it `bytes` zero bytes) as four
// table lookups: the product is linear in the register, so it is the xor of the products
// of its four bytes.
class ZeroShift {
 public:
  constexpr explicit ZeroShift(uint64_t bytes) : table_{} {
    const uint32_t factor = XPow8n(bytes);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) table_[k][b] = MultModP(factor, b << (8 * k));
    }
  }
  uint32_t operator()(uint32_t crc) const {
    return table_[0][crc & 0xff] ^ table_[1][(crc >> 8) & 0xff] ^ table_[2][(crc >> 16) & 0xff] ^
           table_[3][crc >> 24];
  }

 private:
  std::array<std::array<uint32_t, 256>, 4> table_;
};

}  // namespace

namespace crc32c_internal {

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  const auto& t = kSlicing;
  uint32_t l = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    const uint32_t lo = Load32(p) ^ l;
    const uint32_t hi = Load32(p + 4);
    l = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  for (; n > 0; ++p, --n) l = t[0][(l ^ *p) & 0xff] ^ (l >> 8);
  return ~l;
}

#if defined(__x86_64__)

namespace {

// Bytes per stream in one round of three streams: long rounds for the bulk of a buffer,
// short ones for what is left (down to 3 x 256 bytes), then one stream.
constexpr size_t kLongStream = 8192;
constexpr size_t kShortStream = 256;
constexpr ZeroShift kShiftLong(kLongStream);
constexpr ZeroShift kShiftShort(kShortStream);

__attribute__((target("sse4.2"))) inline uint64_t Step8(uint64_t crc, const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return _mm_crc32_u64(crc, v);
}

// Rounds of three streams of `stream` bytes each while at least 3 * stream remain: the
// streams' CRC32 instructions are independent, so they overlap in the pipeline (one
// stream waits out the instruction's 3-cycle latency at each step); the second and third
// start from 0 and are joined as crc(a + b) = shift(crc(a), |b|) ^ crc_0(b).
__attribute__((target("sse4.2"))) inline uint64_t Rounds(uint64_t l, const uint8_t** p, size_t* n,
                                                         size_t stream, const ZeroShift& shift) {
  const uint8_t* q = *p;
  for (; *n >= 3 * stream; q += 3 * stream, *n -= 3 * stream) {
    uint64_t a = l, b = 0, c = 0;
    for (size_t i = 0; i < stream; i += 8) {
      a = Step8(a, q + i);
      b = Step8(b, q + stream + i);
      c = Step8(c, q + 2 * stream + i);
    }
    l = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(c);
  }
  *p = q;
  return l;
}

}  // namespace

bool HasHardware() { return __builtin_cpu_supports("sse4.2"); }

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t l = ~crc;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; ++p, --n) {
    l = _mm_crc32_u8(static_cast<uint32_t>(l), *p);
  }
  l = Rounds(l, &p, &n, kLongStream, kShiftLong);
  l = Rounds(l, &p, &n, kShortStream, kShiftShort);
  for (; n >= 8; p += 8, n -= 8) l = Step8(l, p);
  for (; n > 0; ++p, --n) l = _mm_crc32_u8(static_cast<uint32_t>(l), *p);
  return ~static_cast<uint32_t>(l);
}

#else  // not x86-64: no hardware path

bool HasHardware() { return false; }
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n) { return ExtendPortable(crc, data, n); }

#endif

}  // namespace crc32c_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  return crc32c_internal::HasHardware() ? crc32c_internal::ExtendHardware(crc, data, n)
                                        : crc32c_internal::ExtendPortable(crc, data, n);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // crc(a + b) = shift(crc(a), |b|) ^ crc(b): the inversions at both ends cancel.
  return MultModP(XPow8n(len_b), crc_a) ^ crc_b;
}

}  // namespace gw::nn
