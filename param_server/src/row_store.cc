#include "gradwire/param_server/row_store.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <new>

#include "gradwire/param_server/sharding.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/generator.h"

namespace gw::param_server {

namespace {

// Rows per chunk (log2): 4096 and at least 2 MiB of floats, so chunks fill huge pages;
// a small capacity needs no more than itself.
int ChunkShift(int64_t stride, int64_t capacity) {
  int shift = 12;
  while ((int64_t{1} << shift) * stride * static_cast<int64_t>(sizeof(float)) < (int64_t{2} << 20)) ++shift;
  if (capacity > 0) {
    shift = std::min<int>(shift, std::bit_width(static_cast<uint64_t>(std::max<int64_t>(capacity - 1, 1))));
  }
  return shift;
}

}  // namespace

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

// Validates the layout before any member derived from it exists.
int64_t RowStore::CheckedStride(int64_t dim, int state_size, int64_t capacity) {
  GW_CHECK(dim >= 1 && dim <= kMaxWidth, "RowStore", "row width must be in [1, ", kMaxWidth, "], got ", dim);
  GW_CHECK(state_size >= 0 && state_size <= 3, "RowStore", "state size must be in [0, 3], got ", state_size);
  GW_CHECK(dim * (1 + state_size) <= kMaxWidth, "RowStore", "a row with its state is ", dim * (1 + state_size),
           " floats, more than ", kMaxWidth);
  GW_CHECK(capacity >= 0 && capacity <= kMaxRows, "RowStore", "capacity ", capacity, " out of range [0, ", kMaxRows,
           "]");
  return kHeaderFloats + (dim * (1 + state_size) + 1) / 2 * 2;
}

RowStore::RowStore(int64_t dim, int state_size, int64_t capacity, RowInit init)
    : dim_(dim),
      state_size_(state_size),
      capacity_(capacity),
      init_(init),
      stride_(CheckedStride(dim, state_size, capacity)),
      chunk_shift_(ChunkShift(stride_, capacity)),
      chunk_rows_(int64_t{1} << chunk_shift_) {
  // Bounded stores size the index once; load stays at most 3/4.
  size_t buckets = 16;
  while (capacity > 0 && static_cast<int64_t>(buckets) * 3 < capacity * 4) buckets *= 2;
  index_.assign(buckets, kEmptyEntry);
}

RowStore::~RowStore() = default;

RowStore::Row RowStore::RowOf(uint32_t slot) const {
  float* slot_base = SlotBase(slot);
  float* values = slot_base + kHeaderFloats;
  return {values, values + dim_, reinterpret_cast<int64_t*>(slot_base) + 1};
}

float* RowStore::SlotBase(uint32_t slot) const {
  return chunks_[slot >> chunk_shift_].floats.get() + static_cast<int64_t>(slot & (chunk_rows_ - 1)) * stride_;
}
uint64_t RowStore::IdOf(uint32_t slot) const { return *reinterpret_cast<const uint64_t*>(SlotBase(slot)); }
uint32_t& RowStore::Prev(uint32_t slot) const { return chunks_[slot >> chunk_shift_].prev[slot & (chunk_rows_ - 1)]; }
uint32_t& RowStore::Next(uint32_t slot) const { return chunks_[slot >> chunk_shift_].next[slot & (chunk_rows_ - 1)]; }

// Not MixId(id) itself: IdPlacement already fixed its low bits (the bucket) per server.
uint64_t RowStore::Hash(uint64_t id) { return MixId(~id); }
uint64_t RowStore::Bucket(uint64_t id) const { return Hash(id) & (index_.size() - 1); }

// The probe of Lookup on tags alone (no row is read): the first entry from id's home
// bucket whose tag matches, which is id's own entry unless a 1-in-32 tag collision comes
// first. Linear probing leaves many ids past their home bucket, so prefetching the home
// bucket's row would fetch the wrong row for them.
void RowStore::PrefetchRow(uint64_t id) const {
  const uint64_t mask = index_.size() - 1, hash = Hash(id);
  const uint32_t tag = static_cast<uint32_t>(hash >> (64 - kTagBits));
  uint32_t e;
  for (uint64_t b = hash & mask;; b = (b + 1) & mask) {
    e = index_[b];
    if (e == kEmptyEntry) return;
    if ((e >> kSlotBits) == tag) break;
  }
  const uint32_t slot = e & kSlotMask;
  const char* row = reinterpret_cast<const char*>(SlotBase(slot));
  const int64_t bytes = std::min<int64_t>(stride_ * static_cast<int64_t>(sizeof(float)), 1024);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
}

// An index entry is (tag << kSlotBits | slot), the tag being the hash's top bits: most
// probes that miss are rejected without reading the row's id.
int64_t RowStore::Lookup(uint64_t id) const {
  const uint64_t mask = index_.size() - 1, hash = Hash(id);
  const uint32_t tag = static_cast<uint32_t>(hash >> (64 - kTagBits));
  for (uint64_t b = hash & mask;; b = (b + 1) & mask) {
    const uint32_t e = index_[b];
    if (e == kEmptyEntry) return -1;
    if ((e >> kSlotBits) == tag && IdOf(e & kSlotMask) == id) return static_cast<int64_t>(b);
  }
}

void RowStore::InsertIndex(uint64_t id, uint32_t slot) {
  const uint64_t mask = index_.size() - 1, hash = Hash(id);
  uint64_t b = hash & mask;
  while (index_[b] != kEmptyEntry) b = (b + 1) & mask;
  index_[b] = static_cast<uint32_t>(hash >> (64 - kTagBits)) << kSlotBits | slot;
}

// Backward-shift deletion keeps every probe sequence unbroken without tombstones.
void RowStore::EraseIndex(int64_t bucket) {
  const uint64_t mask = index_.size() - 1;
  uint64_t hole = static_cast<uint64_t>(bucket);
  index_[hole] = kEmptyEntry;
  for (uint64_t j = (hole + 1) & mask; index_[j] != kEmptyEntry; j = (j + 1) & mask) {
    const uint64_t home = Bucket(IdOf(index_[j] & kSlotMask));
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      index_[hole] = index_[j];
      index_[j] = kEmptyEntry;
      hole = j;
    }
  }
}

void RowStore::Grow() {
  std::vector<uint32_t, LargeAllocator<uint32_t>> old(index_.size() * 2, kEmptyEntry);
  old.swap(index_);
  for (uint32_t e : old) {
    if (e != kEmptyEntry) InsertIndex(IdOf(e & kSlotMask), e & kSlotMask);
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
    GW_CHECK(size_ < kMaxRows, "RowStore", "a table shard holds at most ", kMaxRows,
             " rows; set a capacity or add servers");
    slot = static_cast<uint32_t>(size_++);
    if ((slot >> chunk_shift_) == static_cast<int64_t>(chunks_.size())) {
      Chunk c;
      c.floats.reset(static_cast<float*>(AllocateLarge(static_cast<size_t>(chunk_rows_ * stride_) * sizeof(float))));
      if (capacity_ > 0) {
        c.prev = std::make_unique<uint32_t[]>(static_cast<size_t>(chunk_rows_));
        c.next = std::make_unique<uint32_t[]>(static_cast<size_t>(chunk_rows_));
      }
      chunks_.push_back(std::move(c));
    }
    if (capacity_ == 0 && size_ * 4 > static_cast<int64_t>(index_.size()) * 3) Grow();
  }
  *reinterpret_cast<uint64_t*>(SlotBase(slot)) = id;
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
  const uint32_t slot = index_[static_cast<size_t>(b)] & kSlotMask;
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
  const size_t per_row = static_cast<size_t>(stride_) * sizeof(float) + (capacity_ > 0 ? 2 * sizeof(uint32_t) : 0);
  return chunks_.size() * static_cast<size_t>(chunk_rows_) * per_row + index_.size() * sizeof(uint32_t) +
         chunks_.capacity() * sizeof(Chunk) + sizeof(*this);
}

size_t RowStore::raw_bytes() const { return static_cast<size_t>(size_ * dim_ * (1 + state_size_)) * sizeof(float); }

}  // namespace gw::param_server
