// The GPU test binaries' (CTest label gpu) one precondition: REQUIRE_GPU() skips the test,
// with the reason (no GPU, no driver, a CPU-only build), where no GPU can be used, so CTest
// reports it as skipped, never as passed. Also kGpu, the device those tests run on.
#ifndef GRADWIRE_CMAKE_REQUIRE_GPU_H_
#define GRADWIRE_CMAKE_REQUIRE_GPU_H_

#include <gtest/gtest.h>

#include "gradwire/tensor/cuda.h"

#define REQUIRE_GPU()                                                              \
  do {                                                                             \
    if (!::gw::cuda::Available()) GTEST_SKIP() << ::gw::cuda::UnavailableReason(); \
  } while (false)

namespace gw::testing {
inline constexpr Device kGpu = Cuda(0);
}  // namespace gw::testing

#endif  // GRADWIRE_CMAKE_REQUIRE_GPU_H_
