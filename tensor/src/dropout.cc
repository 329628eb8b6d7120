// The counter-based dropout stream of dropout.h.
#include "dropout.h"

#include <algorithm>
#include <cmath>

#include "gradwire/tensor/vector_math.h"

namespace gw::internal {
namespace {

// A well-mixed 32-bit hash (Wellons' lowbias32).
inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// One chunk of at most 2^32 elements: the decision for element i is the hash of (i ^ lo)
// and `key`. kApply multiplies `in` by the factor; otherwise the factor is written.
template <typename T, bool kApply>
GW_VECTOR_CLONES void DropoutChunk(const T* in, T* out, uint32_t n, uint32_t lo, uint32_t key,
                                   uint32_t threshold, T scale) {
  for (uint32_t i = 0; i < n; ++i) {
    const T factor = Mix32(Mix32(i ^ lo) + key) >= threshold ? scale : T{0};
    if constexpr (kApply) {
      out[i] = in[i] * factor;
    } else {
      out[i] = factor;
    }
  }
}

}  // namespace

template <typename T>
void ApplyDropout(Generator& gen, double p, const T* in, T* out, int64_t count) {
  if (p >= 1) {
    std::fill_n(out, count, T{0});
    return;
  }
  const uint64_t seed = gen.NextU64();
  const uint32_t threshold = static_cast<uint32_t>(std::ldexp(p, 32));
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const uint32_t lo = static_cast<uint32_t>(seed);
  constexpr int64_t kChunk = int64_t{1} << 30;  // 32-bit counters within a chunk
  for (int64_t start = 0; start < count; start += kChunk) {
    const uint32_t key =
        Mix32(static_cast<uint32_t>(seed >> 32) + static_cast<uint32_t>(start >> 30));
    const uint32_t n = static_cast<uint32_t>(std::min(kChunk, count - start));
    if (in != nullptr) {
      DropoutChunk<T, true>(in + start, out + start, n, lo, key, threshold, scale);
    } else {
      DropoutChunk<T, false>(nullptr, out + start, n, lo, key, threshold, scale);
    }
  }
}

template void ApplyDropout<float>(Generator&, double, const float*, float*, int64_t);
template void ApplyDropout<double>(Generator&, double, const double*, double*, int64_t);

}  // namespace gw::internal
