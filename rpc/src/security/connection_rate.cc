#include "security/connection_rate.h"

#include <algorithm>

namespace gw::rpc::internal {

bool ConnectionRate::Take(const std::string& ip, absl::Time now) {
  if (per_second_ <= 0) return true;
  const double burst = 2.0 * per_second_;
  absl::MutexLock lock(&mu_);
  if (buckets_.size() > 65536) {  // bounded memory under a spray of addresses
    // Buckets idle long enough to have refilled hold nothing: forget those first.
    const absl::Duration refill = absl::Seconds(2);
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      if (now - it->second.last >= refill) {
        buckets_.erase(it++);
      } else {
        ++it;
      }
    }
    if (buckets_.size() > 65536) buckets_.clear();
  }
  auto [it, fresh] = buckets_.try_emplace(ip, Bucket{burst, now});
  Bucket& b = it->second;
  if (!fresh) {
    b.tokens = std::min(burst, b.tokens + absl::ToDoubleSeconds(now - b.last) * per_second_);
    b.last = now;
  }
  if (b.tokens < 1.0) return false;
  b.tokens -= 1.0;
  return true;
}

}  // namespace gw::rpc::internal
