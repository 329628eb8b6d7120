#include "gradwire/param_server/row_store.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "gradwire/param_server/sharding.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/generator.h"

namespace gw::param_server {

void InitRow(const RowInit& init, uint64_t id, int64_t dim, float* out) {
  if (init.kind == RowInit::Kind::kZeros) {
    std::fill(out, out + dim, 0.0f);
    return;
  }
  Generator gen(init.seed ^ MixId(id));
  for (int64_t i = 0; i < dim; ++i) {
    out[i] = static_cast<float>(init.kind == RowInit::Kind::kUniform ? init.a + (init.b - init.a) * gen.NextDouble()
                                                                     : init.a + init.b * gen.NextNormal());
  }
}

RowStore::RowStore(int64_t dim, int state_size, int64_t capacity, RowInit init)
    : dim_(dim),
      state_size_(state_size),
      capacity_(capacity),
      init_(init),
      stride_(dim * (1 + state_size)),
      chunk_rows_(capacity > 0 ? std::min(kChunkRows, capacity) : kChunkRows) {
  GW_CHECK(dim >= 1, "RowStore", "row width must be at least 1, got ", dim);
  GW_CHECK(state_size >= 0, "RowStore", "negative state size ", state_size);
  GW_CHECK(capacity >= 0 && capacity < kEmpty, "RowStore", "capacity ", capacity, " out of range");
  // Bounded stores size the index once; load stays at most 3/4.
  size_t buckets = 16;
  while (capacity > 0 && static_cast<int64_t>(buckets) * 3 < capacity * 4) buckets *= 2;
  index_.assign(buckets, kEmpty);
}

RowStore::~RowStore() = default;

RowStore::Row RowStore::RowOf(uint32_t slot) const {
  const Chunk& c = chunks_[slot / chunk_rows_];
  const int64_t i = slot % chunk_rows_;
  float* values = c.floats.get() + i * stride_;
  return {values, values + dim_, &c.steps[i]};
}

uint64_t RowStore::IdOf(uint32_t slot) const { return chunks_[slot / chunk_rows_].ids[slot % chunk_rows_]; }
uint32_t& RowStore::Prev(uint32_t slot) const { return chunks_[slot / chunk_rows_].prev[slot % chunk_rows_]; }
uint32_t& RowStore::Next(uint32_t slot) const { return chunks_[slot / chunk_rows_].next[slot % chunk_rows_]; }

// Not MixId(id) itself: ServerOfId already fixed its residue modulo the server count.
uint64_t RowStore::Bucket(uint64_t id) const { return MixId(~id) & (index_.size() - 1); }

int64_t RowStore::Lookup(uint64_t id) const {
  const uint64_t mask = index_.size() - 1;
  for (uint64_t b = Bucket(id);; b = (b + 1) & mask) {
    if (index_[b] == kEmpty) return -1;
    if (IdOf(index_[b]) == id) return static_cast<int64_t>(b);
  }
}

void RowStore::InsertIndex(uint64_t id, uint32_t slot) {
  const uint64_t mask = index_.size() - 1;
  uint64_t b = Bucket(id);
  while (index_[b] != kEmpty) b = (b + 1) & mask;
  index_[b] = slot;
}

// Backward-shift deletion keeps every probe sequence unbroken without tombstones.
void RowStore::EraseIndex(int64_t bucket) {
  const uint64_t mask = index_.size() - 1;
  uint64_t hole = static_cast<uint64_t>(bucket);
  index_[hole] = kEmpty;
  for (uint64_t j = (hole + 1) & mask; index_[j] != kEmpty; j = (j + 1) & mask) {
    const uint64_t home = Bucket(IdOf(index_[j]));
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      index_[hole] = index_[j];
      index_[j] = kEmpty;
      hole = j;
    }
  }
}

void RowStore::Grow() {
  std::vector<uint32_t> old(index_.size() * 2, kEmpty);
  old.swap(index_);
  for (uint32_t slot : old) {
    if (slot != kEmpty) InsertIndex(IdOf(slot), slot);
  }
}

void RowStore::Unlink(uint32_t slot) {
  const uint32_t p = Prev(slot), n = Next(slot);
  (p == kEmpty ? head_ : Next(p)) = n;
  (n == kEmpty ? tail_ : Prev(n)) = p;
}

void RowStore::PushFront(uint32_t slot) {
  Prev(slot) = kEmpty;
  Next(slot) = head_;
  (head_ == kEmpty ? tail_ : Prev(head_)) = slot;
  head_ = slot;
}

uint32_t RowStore::NewSlot(uint64_t id) {
  uint32_t slot;
  if (capacity_ > 0 && size_ == capacity_) {  // full: reuse the least recently touched row
    slot = tail_;
    EraseIndex(Lookup(IdOf(slot)));
    Unlink(slot);
    ++evictions_;
  } else {
    slot = static_cast<uint32_t>(size_++);
    if (slot / chunk_rows_ == static_cast<int64_t>(chunks_.size())) {
      Chunk c;
      c.floats = std::make_unique<float[]>(static_cast<size_t>(chunk_rows_ * stride_));
      c.ids = std::make_unique<uint64_t[]>(static_cast<size_t>(chunk_rows_));
      c.steps = std::make_unique<int64_t[]>(static_cast<size_t>(chunk_rows_));
      if (capacity_ > 0) {
        c.prev = std::make_unique<uint32_t[]>(static_cast<size_t>(chunk_rows_));
        c.next = std::make_unique<uint32_t[]>(static_cast<size_t>(chunk_rows_));
      }
      chunks_.push_back(std::move(c));
    }
    if (capacity_ == 0 && size_ * 4 > static_cast<int64_t>(index_.size()) * 3) Grow();
  }
  chunks_[slot / chunk_rows_].ids[slot % chunk_rows_] = id;
  InsertIndex(id, slot);
  if (capacity_ > 0) PushFront(slot);
  Row row = RowOf(slot);
  InitRow(init_, id, dim_, row.values);
  std::fill(row.state, row.state + state_size_ * dim_, 0.0f);
  *row.step = 0;
  return slot;
}

bool RowStore::Find(uint64_t id, Row* row) {
  const int64_t b = Lookup(id);
  if (b < 0) return false;
  const uint32_t slot = index_[static_cast<size_t>(b)];
  if (capacity_ > 0 && head_ != slot) {
    Unlink(slot);
    PushFront(slot);
  }
  *row = RowOf(slot);
  return true;
}

RowStore::Row RowStore::Get(uint64_t id) {
  Row row;
  if (Find(id, &row)) return row;
  return RowOf(NewSlot(id));
}

void RowStore::ForEach(const std::function<void(uint64_t, const Row&)>& fn) const {
  if (capacity_ > 0) {
    for (uint32_t s = tail_; s != kEmpty; s = Prev(s)) fn(IdOf(s), RowOf(s));
    return;
  }
  for (int64_t s = 0; s < size_; ++s) fn(IdOf(static_cast<uint32_t>(s)), RowOf(static_cast<uint32_t>(s)));
}

size_t RowStore::bytes() const {
  const size_t per_row = static_cast<size_t>(stride_) * sizeof(float) + sizeof(uint64_t) + sizeof(int64_t) +
                         (capacity_ > 0 ? 2 * sizeof(uint32_t) : 0);
  return chunks_.size() * static_cast<size_t>(chunk_rows_) * per_row + index_.size() * sizeof(uint32_t) +
         chunks_.capacity() * sizeof(Chunk) + sizeof(*this);
}

size_t RowStore::raw_bytes() const { return static_cast<size_t>(size_ * stride_) * sizeof(float); }

}  // namespace gw::param_server
