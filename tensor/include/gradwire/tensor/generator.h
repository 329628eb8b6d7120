// Generator: an explicit, seeded source of random numbers.
//
// Contract
//   - There is no hidden global generator: every random op takes a Generator&.
//   - The same seed gives the same sequence on every platform (a fixed 64-bit
//     xoshiro256** stream, Box-Muller normals), so seeded runs are reproducible.
//   - Not thread-safe: give each thread its own Generator (Fork() derives one).
#ifndef GRADWIRE_TENSOR_GENERATOR_H_
#define GRADWIRE_TENSOR_GENERATOR_H_

#include <cstdint>

namespace gw {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0);

  uint64_t NextU64();
  // Uniform in [0, 1).
  double NextDouble();
  // Standard normal.
  double NextNormal();
  // Uniform integer in [0, n). REQUIRES: n > 0.
  uint64_t NextBelow(uint64_t n);
  // An independent generator seeded from this one.
  Generator Fork();

 private:
  uint64_t s_[4];
  bool has_spare_normal_ = false;
  double spare_normal_ = 0.0;
};

}  // namespace gw

#endif  // GRADWIRE_TENSOR_GENERATOR_H_
