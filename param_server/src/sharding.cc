#include "gradwire/param_server/sharding.h"

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

int ServerOfId(uint64_t id, int servers) {
  GW_CHECK(servers >= 1, "ServerOfId", "needs at least one server, got ", servers);
  return static_cast<int>(MixId(id) % static_cast<uint64_t>(servers));
}

}  // namespace gw::param_server
