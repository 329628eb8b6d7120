#include "gradwire/param_server/sharding.h"

#include <algorithm>
#include <utility>

#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"

namespace gw::param_server {

std::vector<KeyRange> ShardDense(int64_t size, int servers) {
  GW_CHECK(servers >= 1, "ShardDense", "needs at least one server, got ", servers);
  GW_CHECK(size >= 0, "ShardDense", "negative table size ", size);
  std::vector<KeyRange> ranges;
  const int64_t base = size / servers, longer = size % servers;
  int64_t begin = 0;
  for (int s = 0; s < servers; ++s) {
    const int64_t length = base + (s < longer ? 1 : 0);
    ranges.push_back({begin, begin + length});
    begin += length;
  }
  return ranges;
}

Tensor JoinShards(const std::vector<Tensor>& shards, const Shape& shape) {
  std::vector<Tensor> nonempty;
  for (const Tensor& p : shards) {
    if (p.numel() > 0) nonempty.push_back(p);
  }
  Tensor flat = nonempty.size() == 1 ? nonempty[0] : kernels::Cat(nonempty, 0);
  return kernels::Reshape(flat, shape);
}

IdPlacement::IdPlacement(const std::vector<std::string>& servers) : servers_(static_cast<int>(servers.size())) {
  GW_CHECK(!servers.empty() && servers.size() < (1u << 16), "IdPlacement", "needs 1 to 65535 servers, got ",
           servers.size());
  // The ring: kPointsPerServer points per server, at hashes of its name.
  std::vector<std::pair<uint64_t, uint16_t>> ring;
  ring.reserve(servers.size() * kPointsPerServer);
  for (size_t s = 0; s < servers.size(); ++s) {
    uint64_t name = 0xcbf29ce484222325ULL;  // FNV-1a: the same on every host and build
    for (unsigned char c : servers[s]) name = (name ^ c) * 0x100000001b3ULL;
    for (uint64_t p = 0; p < kPointsPerServer; ++p) {
      ring.emplace_back(MixId(name ^ MixId(p + 1)), static_cast<uint16_t>(s));
    }
  }
  std::sort(ring.begin(), ring.end());
  // Bucket b sits at b * 2^48 on the ring; it belongs to the first point at or after it.
  owner_.resize(kBuckets);
  size_t next = 0;
  for (uint64_t b = 0; b < static_cast<uint64_t>(kBuckets); ++b) {
    const uint64_t at = b << 48;
    while (next < ring.size() && ring[next].first < at) ++next;
    owner_[b] = ring[next == ring.size() ? 0 : next].second;
  }
}

}  // namespace gw::param_server
