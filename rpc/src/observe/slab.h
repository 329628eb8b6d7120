// Internal: Slab, 2 MiB of memory aligned to 2 MiB and advised to the kernel as one huge
// page (madvise MADV_HUGEPAGE), for memory that a hot path must find touched already.
// Where page faults are slow (14 us a 4 KiB page on the VM of BENCHMARKS.md), touching
// 2 MiB page by page costs 7 ms; backed by a huge page, one fault.
//
// Contract
//   - Slab::Make() maps the memory (null when the system has none to give); the kernel
//     may still back it with small pages (transparent huge pages off, or none free).
//   - The memory is unmapped when the Slab is destroyed.
#ifndef GRADWIRE_RPC_SRC_OBSERVE_SLAB_H_
#define GRADWIRE_RPC_SRC_OBSERVE_SLAB_H_

#include <cstddef>
#include <memory>

namespace gw::rpc::internal {

class Slab {
 public:
  static constexpr size_t kBytes = size_t{2} << 20;

  static std::unique_ptr<Slab> Make();
  ~Slab();
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;

  char* data() const { return data_; }

 private:
  explicit Slab(char* data) : data_(data) {}
  char* data_;
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_OBSERVE_SLAB_H_
