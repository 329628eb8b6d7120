// Internal: PerThread<T>(owner, make), the object of type T that the calling thread keeps
// for `owner` (a tracer's buffer, a dispatcher's handler slot), found without a lock.
//
// Contract
//   - `owner` is an id never reused in the process (NextOwnerId()), so an object of an
//     owner that is gone is never taken for one of a new owner at the same address.
//   - make() runs on the thread's first use for an owner; the owner keeps the object it
//     returns alive as long as it may be looked up (the thread keeps a plain pointer).
//   - A thread remembers its objects of the last 8 owners of type T.
#ifndef GRADWIRE_RPC_SRC_OBSERVE_PER_THREAD_H_
#define GRADWIRE_RPC_SRC_OBSERVE_PER_THREAD_H_

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

namespace gw::rpc::internal {

inline uint64_t NextOwnerId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

template <typename T, typename Make>
T* PerThread(uint64_t owner, Make&& make) {
  thread_local std::vector<std::pair<uint64_t, T*>> objects;
  for (const auto& [id, object] : objects) {
    if (id == owner) return object;
  }
  T* object = make();
  if (objects.size() >= 8) objects.erase(objects.begin());
  objects.emplace_back(owner, object);
  return object;
}

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_OBSERVE_PER_THREAD_H_
