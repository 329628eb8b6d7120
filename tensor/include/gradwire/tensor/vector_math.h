// Vectorisable float32 math for kernel loops (for layer authors): exp and tanh without a
// library call, so that loops over them vectorise, and GW_VECTOR_CLONES to compile a loop
// for the CPU's vector width.
//
// Contract
//   - vector_math::Exp: Cephes' expf (range reduction by ln 2 in two parts, a degree-6
//     polynomial, 2^n from the exponent bits), within 2 ulp of expf; below -87.3 it returns
//     about 1e-38 instead of 0; NaN stays NaN.
//   - vector_math::Tanh: Cephes' tanhf (an odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1)
//     above), within a few ulp.
//   - GW_VECTOR_CLONES before a function compiles it for AVX-512, AVX2 and the baseline,
//     chosen when the program starts (GCC's target_clones; the library itself targets
//     baseline x86-64). Elsewhere, under clang (whose target_clones takes no function
//     templates) and under ThreadSanitizer (whose instrumented ifunc resolver would run
//     before the sanitizer's runtime is set up, and crash at load), it is empty: the
//     baseline build.
#ifndef GRADWIRE_TENSOR_VECTOR_MATH_H_
#define GRADWIRE_TENSOR_VECTOR_MATH_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define GW_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GW_VECTOR_CLONES
#endif

namespace gw::vector_math {

inline float Exp(float x) {
  const float clamped = std::min(std::max(x, -87.3365447505f), 88.3762626647949f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (clamped * 1.44269504088896341f + kRound) - kRound;
  const float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return x != x ? x : y * scale;
}

inline float Tanh(float x) {
  const float ax = std::abs(x);
  const float z = x * x;
  const float small =
      ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
       3.33332819422e-1f) * z * ax + ax;
  const float large = 1.0f - 2.0f / (Exp(2.0f * ax) + 1.0f);
  return std::copysign(ax < 0.625f ? small : large, x);
}

}  // namespace gw::vector_math

#endif  // GRADWIRE_TENSOR_VECTOR_MATH_H_
