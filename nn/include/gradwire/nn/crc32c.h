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
//   - Dispatch: on x86-64 CPUs with SSE4.2 (checked at every call with
//     __builtin_cpu_supports, a load of a flag libgcc sets at start-up) the CRC32
//     instruction runs three interleaved streams over large buffers, combined by shifting
//     with precomputed tables (as Google's crc32c and Linux do): about 3x one stream's
//     rate, bound by the instruction's throughput. Elsewhere a portable slicing-by-8 table
//     loop computes the same values. Both are exposed in crc32c_internal for the tests.
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
// True when ExtendHardware can run on this CPU (x86-64 with SSE4.2).
bool HasHardware();
// REQUIRES: HasHardware().
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n);

}  // namespace crc32c_internal
}  // namespace gw::nn

#endif  // GRADWIRE_NN_CRC32C_H_
