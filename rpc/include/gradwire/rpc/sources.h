// Sources<T>: a registry of functions that append records of type T when asked, the
// pattern behind Statistics (statistics.h) and Waits (waits.h): each layer adds a source
// that reads its own state, and nothing is recorded until someone collects.
//
// Contract
//   - Add(name, collect) adds a source: collect(out) appends its records. It must be
//     quick, must not block on other threads, and must not add or drop sources. The
//     returned handle keeps the source: dropping its last copy removes it, waiting for a
//     collect of it that is running, so the source's state may go right after.
//   - Collect() runs every source, in the order they were added, and returns their
//     records. Thread-safe.
#ifndef GRADWIRE_RPC_SOURCES_H_
#define GRADWIRE_RPC_SOURCES_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gw::rpc {

template <typename T>
class Sources {
 public:
  using Collector = std::function<void(std::vector<T>&)>;
  using Source = std::shared_ptr<void>;

  [[nodiscard]] Source Add(std::string name, Collector collect) {
    auto entry = std::make_shared<Entry>();
    entry->name = std::move(name);
    {
      absl::MutexLock lock(&entry->mu);
      entry->collect = std::move(collect);
    }
    {
      absl::MutexLock lock(&mu_);
      entries_.push_back(entry);
    }
    // The handle: its deleter retires the source.
    return Source(static_cast<void*>(entry.get()), [entry](void*) {
      absl::MutexLock lock(&entry->mu);
      entry->collect = nullptr;
    });
  }

  std::vector<T> Collect() const {
    std::vector<std::shared_ptr<Entry>> entries;
    {
      absl::MutexLock lock(&mu_);
      // Retired sources leave the list here.
      std::erase_if(entries_, [](const std::shared_ptr<Entry>& e) {
        absl::MutexLock l(&e->mu);
        return !e->collect;
      });
      entries = entries_;
    }
    std::vector<T> out;
    for (const std::shared_ptr<Entry>& e : entries) {
      absl::MutexLock lock(&e->mu);
      if (e->collect) e->collect(out);
    }
    return out;
  }

 private:
  // A source; `collect` is reset (under `mu`) when its handle goes, so a running collect
  // finishes before the source's state may.
  struct Entry {
    std::string name;
    absl::Mutex mu;
    Collector collect ABSL_GUARDED_BY(mu);
  };

  mutable absl::Mutex mu_;
  mutable std::vector<std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_SOURCES_H_
