#include "connection_rate.h"

#include <algorithm>

namespace gw::rpc::internal {

bool ConnectionRate::Take(const std::string& ip, absl::Time now) {
  if (per_second_ <= 0) return true;
  const double burst = 2.0 * per_second_;
  absl::MutexLock lock(&mu_);
  if (buckets_.size() > 65536) buckets_.clear();  // bounded memory under a spray of addresses
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
