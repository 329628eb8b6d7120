#include "cluster/liveness.h"

#include <algorithm>

namespace gw::rpc::internal {

Liveness::Liveness(int world_size, absl::Duration interval, absl::Duration timeout)
    : world_size_(std::max(0, world_size)),
      interval_(interval),
      timeout_(std::max(timeout, interval)),
      heard_(new std::atomic<uint64_t>[static_cast<size_t>(world_size_)]()),
      watch_(static_cast<size_t>(world_size_)) {}

Liveness::Actions Liveness::Tick(absl::Time now, const std::vector<int>& connected) {
  Actions actions;
  std::vector<bool> is_connected(watch_.size(), false);
  for (int rank : connected) {
    if (rank >= 0 && rank < world_size_) is_connected[static_cast<size_t>(rank)] = true;
  }
  for (size_t rank = 0; rank < watch_.size(); ++rank) {
    Watch& w = watch_[rank];
    if (!is_connected[rank]) {
      w.watching = false;  // nothing to wait on it for; a new connection starts afresh
      continue;
    }
    const uint64_t heard = heard_[rank].load(std::memory_order_relaxed);
    if (!w.watching || heard != w.heard) {
      w = Watch{true, heard, now};
      continue;
    }
    const absl::Duration silent = now - w.last_news;
    if (silent >= timeout_) {
      actions.dead.push_back(static_cast<int>(rank));
      w.watching = false;
    } else if (silent >= interval_) {
      actions.ping.push_back(static_cast<int>(rank));
    }
  }
  return actions;
}

}  // namespace gw::rpc::internal
