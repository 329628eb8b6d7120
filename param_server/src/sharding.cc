#include "gradwire/param_server/sharding.h"

#include "gradwire/tensor/error.h"

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

uint64_t MixId(uint64_t id) {
  uint64_t z = id + 0x9e3779b97f4a7c15ULL;  // SplitMix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

int ServerOfId(uint64_t id, int servers) {
  GW_CHECK(servers >= 1, "ServerOfId", "needs at least one server, got ", servers);
  return static_cast<int>(MixId(id) % static_cast<uint64_t>(servers));
}

}  // namespace gw::param_server
