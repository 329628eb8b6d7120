#include "gradwire/nn/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
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

// x^n mod P, for any number of bits n.
constexpr uint32_t XPowBits(uint64_t n) { return MultModP(1u << (31 - n % 8), XPow8n(n / 8)); }

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

bool HasSse42() { return __builtin_cpu_supports("sse4.2"); }

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const void* data, size_t n) {
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

namespace {

// Folding (Intel's "Fast CRC Computation Using PCLMULQDQ", on 512-bit registers). The
// data is a polynomial, taken 16-byte block by block; a block B followed by D more bits
// stands for B * x^D, and modulo P
//   B * x^D = H * x^(D + 64) + L * x^D
// where H is B's high-degree half (its first 8 bytes: the bits are reflected) and L the
// other. A carry-less product of a 64-bit half and a 32-bit constant k lands in a reflected
// 128-bit block as half * k * x^33, so the constants are k_lo = x^(D + 31) mod P (for H)
// and k_hi = x^(D - 33) mod P (for L). The < 96-bit result is xored into the block D bits
// on: folding keeps the value modulo P, and the one block left at the end, put through the
// CRC32 instruction, has the CRC of everything folded into it.
struct FoldConstants {
  uint32_t lo, hi;
};
constexpr FoldConstants Fold(uint64_t bits) { return {XPowBits(bits + 31), XPowBits(bits - 33)}; }
constexpr FoldConstants kFold2048 = Fold(2048), kFold512 = Fold(512), kFold384 = Fold(384),
                        kFold256 = Fold(256), kFold128 = Fold(128);

#define GW_AVX512_CLMUL __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

GW_AVX512_CLMUL inline __m128i Constants128(FoldConstants k) { return _mm_set_epi64x(k.hi, k.lo); }
GW_AVX512_CLMUL inline __m512i Constants512(FoldConstants k) {
  return _mm512_set_epi64(k.hi, k.lo, k.hi, k.lo, k.hi, k.lo, k.hi, k.lo);
}

// x folded over `next` (four blocks at once, each by the same distance).
GW_AVX512_CLMUL inline __m512i FoldOver(__m512i x, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11),
                                   next, 0x96);  // a ^ b ^ c
}
GW_AVX512_CLMUL inline __m128i FoldOver(__m128i x, FoldConstants k, __m128i next) {
  const __m128i c = Constants128(k);
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, c, 0x00), _mm_clmulepi64_si128(x, c, 0x11)), next);
}

}  // namespace

bool HasAvx512Clmul() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq"); }

GW_AVX512_CLMUL uint32_t ExtendAvx512Clmul(uint32_t crc, const void* data, size_t n) {
  if (n < 256) return ExtendSse42(crc, data, n);
  const auto* p = static_cast<const uint8_t*>(data);
  // Four registers of four blocks, 256 bytes a round; the register (the CRC so far) is
  // xored into the first 32 bits of data.
  __m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128),
          x3 = _mm512_loadu_si512(p + 192);
  x0 = _mm512_xor_si512(x0, _mm512_castsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~crc))));
  p += 256;
  n -= 256;
  const __m512i k2048 = Constants512(kFold2048);
  for (; n >= 256; p += 256, n -= 256) {
    x0 = FoldOver(x0, k2048, _mm512_loadu_si512(p));
    x1 = FoldOver(x1, k2048, _mm512_loadu_si512(p + 64));
    x2 = FoldOver(x2, k2048, _mm512_loadu_si512(p + 128));
    x3 = FoldOver(x3, k2048, _mm512_loadu_si512(p + 192));
  }
  // Into one register, then 64 bytes at a time, then its four blocks into one.
  const __m512i k512 = Constants512(kFold512);
  x3 = FoldOver(FoldOver(FoldOver(x0, k512, x1), k512, x2), k512, x3);
  for (; n >= 64; p += 64, n -= 64) x3 = FoldOver(x3, k512, _mm512_loadu_si512(p));
  alignas(64) __m128i blocks[4];
  _mm512_store_si512(blocks, x3);
  __m128i r = FoldOver(blocks[0], kFold384, blocks[3]);
  r = FoldOver(blocks[1], kFold256, r);
  r = FoldOver(blocks[2], kFold128, r);
  uint64_t l = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(r)));
  l = _mm_crc32_u64(l, static_cast<uint64_t>(_mm_extract_epi64(r, 1)));
  return ExtendSse42(~static_cast<uint32_t>(l), p, n);  // the last < 64 bytes
}

#undef GW_AVX512_CLMUL

#else  // not x86-64: no hardware paths

bool HasSse42() { return false; }
uint32_t ExtendSse42(uint32_t crc, const void* data, size_t n) { return ExtendPortable(crc, data, n); }
bool HasAvx512Clmul() { return false; }
uint32_t ExtendAvx512Clmul(uint32_t crc, const void* data, size_t n) { return ExtendPortable(crc, data, n); }

#endif

}  // namespace crc32c_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  using namespace crc32c_internal;  // NOLINT: the implementations
  if (HasAvx512Clmul()) return ExtendAvx512Clmul(crc, data, n);
  if (HasSse42()) return ExtendSse42(crc, data, n);
  return ExtendPortable(crc, data, n);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // crc(a + b) = shift(crc(a), |b|) ^ crc(b): the inversions at both ends cancel.
  return MultModP(XPow8n(len_b), crc_a) ^ crc_b;
}

}  // namespace gw::nn
