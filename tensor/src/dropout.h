// Internal: dropout's keep-or-drop decisions as a counter-based random stream, shared by
// kernels::DropoutMask and the attention kernels' dropout of the weights.
//
// Contract
//   - ApplyDropout draws one 64-bit seed from `gen` (none when p >= 1) and decides element
//     i from a 32-bit hash of i and the seed alone: dropped when the hash is below
//     p * 2^32. A decision depends on nothing sequential, so the loop vectorises, and a
//     seeded Generator gives the same stream on every run and every CPU.
//   - The hash applies Wellons' lowbias32 twice (to i xor the seed's low half, plus a key
//     from its high half and the index's 2^30-element chunk).
//   - out[i] = in[i] * m_i, or m_i when `in` is null (the mask itself), where m_i is
//     1 / (1 - p) for a kept element and 0 for a dropped one; p >= 1 drops everything.
//     `in` may be `out` (in place).
//   - Compiled for AVX-512, AVX2 and baseline x86-64, chosen at load time; every variant
//     gives the same bits.
//   - Thread safety: concurrent calls with distinct Generators are safe.
#ifndef GRADWIRE_TENSOR_SRC_DROPOUT_H_
#define GRADWIRE_TENSOR_SRC_DROPOUT_H_

#include <cstdint>

#include "gradwire/tensor/generator.h"

namespace gw::internal {

// REQUIRES: 0 <= p <= 1; T float or double.
template <typename T>
void ApplyDropout(Generator& gen, double p, const T* in, T* out, int64_t count);

}  // namespace gw::internal

#endif  // GRADWIRE_TENSOR_SRC_DROPOUT_H_
