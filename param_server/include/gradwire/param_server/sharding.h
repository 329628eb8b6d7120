// Sharding: which server holds which part of a table.
//
// Contract
//   - Dense tables are flat arrays of `size` elements split into one contiguous key range
//     per server, in server order; the ranges cover [0, size) exactly, with no gap and no
//     overlap, and their lengths differ by at most one (the first size % servers ranges
//     are one longer). A server may get an empty range when size < servers.
//   - JoinShards(shards, shape): a dense table from its shards in server order (empty
//     ones skipped; one shard: no copy), reshaped to `shape`.
//   - Sparse rows are keyed by 64-bit ids and placed by consistent hashing
//     (IdPlacement): the id's hash (SplitMix64) picks one of 65,536 buckets, and each
//     bucket belongs to the server whose point on a ring (kPointsPerServer per server,
//     placed by a hash of its name) follows the bucket's. Consecutive ids spread over the
//     servers; adding a server moves only the buckets it takes over (about 1/(S+1) of the
//     rows), removing one moves only its own, and the placement depends on the servers'
//     names, not on their order.
//   - Pure functions and an immutable placement; REQUIRES servers >= 1 and size >= 0
//     (checked, gw::Error).
#ifndef GRADWIRE_PARAM_SERVER_SHARDING_H_
#define GRADWIRE_PARAM_SERVER_SHARDING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gw::param_server {

struct KeyRange {
  int64_t begin = 0;  // first key
  int64_t end = 0;    // one past the last key
  int64_t size() const { return end - begin; }
};

std::vector<KeyRange> ShardDense(int64_t size, int servers);

Tensor JoinShards(const std::vector<Tensor>& shards, const Shape& shape);

// The 64-bit mix (SplitMix64's finaliser) behind IdPlacement; also hashes ids in RowStore
// and StripedRows (several times per row on the sparse hot path, hence inline).
inline uint64_t MixId(uint64_t id);

class IdPlacement {
 public:
  static constexpr int kBuckets = 1 << 16;
  static constexpr int kPointsPerServer = 256;
  // REQUIRES: 1 <= servers.size() < 65,536, names unique.
  explicit IdPlacement(const std::vector<std::string>& servers);
  // The index (in `servers`) of the server that holds row `id`. Uses the low 16 bits of
  // MixId(id): StripedRows uses the top ones, RowStore another hash.
  int ServerOf(uint64_t id) const { return owner_[MixId(id) & (kBuckets - 1)]; }
  int servers() const { return servers_; }

 private:
  int servers_;
  std::vector<uint16_t> owner_;  // by bucket
};

inline uint64_t MixId(uint64_t id) {
  uint64_t z = id + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_SHARDING_H_
