// Internal: Watchers<Event>, the functions that watch one kind of event of an agent
// (Agent::WatchPeers: a rank declared dead; Agent::WatchMembers: a worker joined or
// left).
//
// Contract
//   - Add(fn) returns a watch: dropping its last copy removes fn. The watch holds the
//     list weakly, so it may outlive the list (and the agent).
//   - Notify(event) runs every function added and not removed, on the calling thread,
//     outside the lock: a function may drop its watch (or another's) while it runs, and
//     a function being removed may still run once.
//   - Thread-safe. REQUIRES: owned by a std::shared_ptr (the watches' weak reference).
#ifndef GRADWIRE_RPC_SRC_BASE_WATCHERS_H_
#define GRADWIRE_RPC_SRC_BASE_WATCHERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gw::rpc::internal {

template <typename Event>
class Watchers : public std::enable_shared_from_this<Watchers<Event>> {
 public:
  using Fn = std::function<void(const Event&)>;
  using Watch = std::shared_ptr<void>;

  [[nodiscard]] Watch Add(Fn fn) {
    int64_t id;
    {
      absl::MutexLock lock(&mu_);
      id = next_++;
      fns_.emplace(id, std::make_shared<Fn>(std::move(fn)));
    }
    std::weak_ptr<Watchers> weak = this->weak_from_this();
    return Watch(nullptr, [weak, id](void*) {
      if (auto self = weak.lock()) {
        absl::MutexLock lock(&self->mu_);
        self->fns_.erase(id);
      }
    });
  }

  void Notify(const Event& event) {
    std::vector<std::shared_ptr<Fn>> fns;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, fn] : fns_) fns.push_back(fn);
    }
    for (const auto& fn : fns) (*fn)(event);
  }

 private:
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::shared_ptr<Fn>> fns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_BASE_WATCHERS_H_
