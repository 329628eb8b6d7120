// RowStore: the rows of one sparse table's shard, keyed by 64-bit ids, in bounded memory.
//
// Contract
//   - Each row holds `dim` float32 values, `state_size * dim` float32 optimizer state
//     (optim::UpdateRow's layout) and its update count. Rows are created on first touch
//     with values from RowInit: a pure function of (init, id, dim), so a row starts the
//     same on whichever server holds it and after it was evicted.
//   - Capacity: 0 means unbounded. Otherwise at most `capacity` rows are held and
//     touching a new id when full evicts the least recently touched row (Get and
//     Insert both count as touches); an evicted row that comes back starts afresh.
//   - Memory: rows live in fixed-size chunks (no reallocation, pointers stay valid
//     until the row is evicted); the id index is an open-addressing table of 32-bit
//     entries (a slot number and 5 bits of the id's hash). At most 2^27 - 1 rows. bytes() is everything the store allocated; with 64-float rows it
//     stays within 1.2x of raw_bytes() (the rows' values and state alone) for tables
//     past a few chunks (tested).
//   - Not thread-safe: the server guards each with a lock (a stripe's, shard.h).
#ifndef GRADWIRE_PARAM_SERVER_ROW_STORE_H_
#define GRADWIRE_PARAM_SERVER_ROW_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "gradwire/tensor/large_memory.h"

namespace gw::param_server {

struct RowInit {
  enum class Kind { kZeros = 0, kUniform = 1, kNormal = 2 };
  Kind kind = Kind::kNormal;
  double a = 0;  // kUniform: low; kNormal: mean
  double b = 1;  // kUniform: high; kNormal: standard deviation
  uint64_t seed = 0;
  // Its wire form (rpc records): the fields by name.
  static constexpr auto Fields() {
    return std::make_tuple(std::pair{"kind", &RowInit::kind}, std::pair{"a", &RowInit::a}, std::pair{"b", &RowInit::b},
                           std::pair{"seed", &RowInit::seed});
  }
};

// Writes the initial values of row `id` (dim floats) to `out`.
void InitRow(const RowInit& init, uint64_t id, int64_t dim, float* out);

class RowStore {
 public:
  static constexpr int64_t kMaxRows = (int64_t{1} << 27) - 1;  // slot numbers have 27 bits
  static constexpr int64_t kMaxWidth = int64_t{1} << 22;     // floats per row with its state
  struct Row {
    float* values = nullptr;  // dim floats
    float* state = nullptr;   // state_size * dim floats
    int64_t* step = nullptr;  // updates applied to this row
  };

  // REQUIRES: dim >= 1, 0 <= state_size <= 3, dim * (1 + state_size) <= kMaxWidth,
  // 0 <= capacity <= kMaxRows (checked, gw::Error, before anything is allocated).
  RowStore(int64_t dim, int state_size, int64_t capacity, RowInit init);
  ~RowStore();
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  // The row of `id`, created (initialised, state zero, step 0) if absent.
  Row Get(uint64_t id);
  // Get() for ids[0..n) in order, calling fn(i, row) for each, with the index entries and
  // rows of later ids prefetched: a table larger than the caches is bound by memory
  // latency, and this keeps several misses in flight.
  template <typename F>
  void ForEachRow(const uint64_t* ids, int64_t n, F&& fn) {
    constexpr int64_t kFar = 32, kNear = 12;
    for (int64_t i = 0; i < n; ++i) {
      if (i + kFar < n) __builtin_prefetch(&index_[Bucket(ids[i + kFar])]);
      if (i + kNear < n) PrefetchRow(ids[i + kNear]);
      fn(i, Get(ids[i]));
    }
  }
  // The row of `id` if present (no creation); counts as a touch.
  bool Find(uint64_t id, Row* row);
  // Visits every row (for checkpoints), least recently touched first when bounded.
  void ForEach(const std::function<void(uint64_t id, const Row& row)>& fn) const;

  int64_t dim() const { return dim_; }
  int state_size() const { return state_size_; }
  int64_t capacity() const { return capacity_; }
  int64_t size() const { return size_; }
  int64_t evictions() const { return evictions_; }
  size_t bytes() const;
  size_t raw_bytes() const;

 private:
  static constexpr uint32_t kEmpty = 0xffffffffu;
  // Index entries: 27 bits of slot, 5 bits of hash tag; all ones is empty.
  static constexpr int kSlotBits = 27, kTagBits = 5;
  static constexpr uint32_t kSlotMask = (1u << kSlotBits) - 1, kEmptyEntry = ~0u;

  // Slots are numbered in creation order; slot s lives in chunk s >> chunk_shift_.
  struct Chunk {
    // chunk_rows_ slots of stride_ floats: id (u64), step (i64), values, state (padded to
    // an even count so every slot's header is 8-byte aligned).
    std::unique_ptr<float[], FreeLargeDeleter> floats;
    std::unique_ptr<uint32_t[]> prev, next;  // LRU links (bounded stores only)
  };
  static constexpr int64_t kHeaderFloats = 4;  // the id and the step, inline: one fewer cache miss
  float* SlotBase(uint32_t slot) const;
  Row RowOf(uint32_t slot) const;
  uint64_t IdOf(uint32_t slot) const;
  uint32_t& Prev(uint32_t slot) const;
  uint32_t& Next(uint32_t slot) const;
  static int64_t CheckedStride(int64_t dim, int state_size, int64_t capacity);
  static uint64_t Hash(uint64_t id);
  uint64_t Bucket(uint64_t id) const;
  void PrefetchRow(uint64_t id) const;  // the id and floats of the row in id's home bucket
  int64_t Lookup(uint64_t id) const;  // bucket holding id, or -1
  void InsertIndex(uint64_t id, uint32_t slot);
  void EraseIndex(int64_t bucket);
  void Grow();
  uint32_t NewSlot(uint64_t id);
  void Unlink(uint32_t slot);
  void PushFront(uint32_t slot);

  const int64_t dim_;
  const int state_size_;
  const int64_t capacity_;
  const RowInit init_;
  const int64_t stride_;      // floats per slot: header + values + state (+ padding)
  const int chunk_shift_;     // log2 of the rows per chunk: at least 4096 rows and 2 MiB, fewer for a small capacity
  const int64_t chunk_rows_;
  std::vector<Chunk> chunks_;
  uint32_t head_ = kEmpty, tail_ = kEmpty;  // most / least recently touched
  std::vector<uint32_t, LargeAllocator<uint32_t>> index_;  // power-of-two open addressing: tag | slot
  int64_t size_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_ROW_STORE_H_
