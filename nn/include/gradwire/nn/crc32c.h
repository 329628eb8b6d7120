// CRC32C: the Castagnoli CRC of iSCSI (RFC 3720), ext4 and Google's storage formats,
// used to check the named-tensor files of serialize.h.
//
// Contract
//   - Crc32c(data, n) is the standard CRC-32C: polynomial 0x1EDC6F41 (reflected
//     0x82F63B78), register initialised to 0xFFFFFFFF, input and output reflected, result
//     xored with 0xFFFFFFFF. Crc32c("123456789", 9) == 0xE3069283; Crc32c of no bytes is 0.
//   - Crc32cExtend(crc, data, n) continues a CRC: Crc32c(a + b) ==
//     Crc32cExtend(Crc32c(a), b), and Crc32cExtend(0, data, n) == Crc32c(data, n).
//   - Crc32cCombine(crc_a, crc_b, len_b) == Crc32c(a + b) given only Crc32c(a), Crc32c(b)
//     and b's length, in O(log len_b) without reading the bytes (zlib's crc32_combine).
//   - Dispatch, at every call (__builtin_cpu_supports reads flags libgcc sets at start-up):
//     on x86-64 with AVX-512 and VPCLMULQDQ, buffers of 256 bytes and more are folded 256
//     bytes a round with carry-less multiplications (Intel's PCLMULQDQ method, as ISA-L
//     and Linux do), about 2x the CRC32 instruction's rate; with SSE4.2, the CRC32
//     instruction runs three interleaved streams over large buffers, combined by shifting
//     with precomputed tables (as Google's crc32c and Linux do), about 3x one stream's
//     rate; elsewhere a portable slicing-by-8 table loop. All compute the same values; each
//     is exposed in crc32c_internal for the tests and the benchmark.
//   - Pure functions of their arguments; safe from any thread; no state, no allocation.
#ifndef GRADWIRE_NN_CRC32C_H_
#define GRADWIRE_NN_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace gw::nn {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

namespace crc32c_internal {

// The table-driven loop every CPU can run.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
// True when the function below it can run on this CPU (never off x86-64).
bool HasSse42();
uint32_t ExtendSse42(uint32_t crc, const void* data, size_t n);
// REQUIRES for ExtendAvx512Clmul: HasAvx512Clmul() and HasSse42() (it ends with the CRC32
// instruction).
bool HasAvx512Clmul();
uint32_t ExtendAvx512Clmul(uint32_t crc, const void* data, size_t n);

}  // namespace crc32c_internal
}  // namespace gw::nn

#endif  // GRADWIRE_NN_CRC32C_H_
