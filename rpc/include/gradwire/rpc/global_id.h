// GlobalId: an id that no two workers of a job ever allocate twice, for every object
// gradwire's layers name across workers: RRefs and their forks, distributed-autograd
// contexts and send/recv pairs, DistributedOptimizer instances.
//
// Contract
//   - An id is (rank, counter): the rank of the worker that allocated it (0 <= rank <
//     kMaxRanks) and a per-worker counter (1 <= counter < 2^48). On the wire and in logs
//     it is one 64-bit word, bits() = (rank + 1) << 48 | counter, so that 0 is never a
//     valid id (a default-constructed GlobalId is null: valid() is false).
//   - FromBits() accepts any word and reports whether it is a valid id; a peer's garbage
//     never becomes a valid-looking id with an out-of-range rank.
//   - GlobalIdGenerator hands out the ids of one worker: thread-safe, strictly
//     increasing counters starting at 1.
//   - Ids order by (rank, counter) and hash; ToString() reads "<rank>:<counter>".
#ifndef GRADWIRE_RPC_GLOBAL_ID_H_
#define GRADWIRE_RPC_GLOBAL_ID_H_

#include <atomic>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gradwire/rpc/value.h"

namespace gw::rpc {

class GlobalId {
 public:
  static constexpr int kCounterBits = 48;
  static constexpr uint64_t kCounterMask = (uint64_t{1} << kCounterBits) - 1;
  static constexpr int kMaxRanks = (1 << 16) - 1;  // rank + 1 must fit in the top 16 bits

  constexpr GlobalId() = default;
  // REQUIRES: 0 <= rank < kMaxRanks, 1 <= counter <= kCounterMask.
  static constexpr GlobalId Make(int rank, uint64_t counter) {
    return GlobalId((static_cast<uint64_t>(rank + 1) << kCounterBits) | (counter & kCounterMask));
  }
  // The id a word names, or nullopt when it names none (0, or a zero counter).
  static constexpr std::optional<GlobalId> FromBits(uint64_t bits) {
    if ((bits >> kCounterBits) == 0 || (bits & kCounterMask) == 0) return std::nullopt;
    return GlobalId(bits);
  }

  constexpr bool valid() const { return bits_ != 0; }
  constexpr uint64_t bits() const { return bits_; }
  // -1 for the null id.
  constexpr int rank() const { return static_cast<int>(bits_ >> kCounterBits) - 1; }
  constexpr uint64_t counter() const { return bits_ & kCounterMask; }
  std::string ToString() const {
    return valid() ? absl::StrCat(rank(), ":", counter()) : std::string("null");
  }

  constexpr auto operator<=>(const GlobalId&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const GlobalId& id) {
    return H::combine(std::move(h), id.bits_);
  }

 private:
  explicit constexpr GlobalId(uint64_t bits) : bits_(bits) {}
  uint64_t bits_ = 0;
};

class GlobalIdGenerator {
 public:
  // REQUIRES: 0 <= rank < GlobalId::kMaxRanks.
  explicit GlobalIdGenerator(int rank) : rank_(rank) {}
  GlobalId Next() { return GlobalId::Make(rank_, next_.fetch_add(1, std::memory_order_relaxed)); }
  int rank() const { return rank_; }

 private:
  const int rank_;
  std::atomic<uint64_t> next_{1};
};

// On the wire: the 64-bit word (as int); the null id travels as 0.
template <>
struct ValueTraits<GlobalId> {
  static constexpr const char* kName = "id";
  static Value To(GlobalId id) { return Value(static_cast<int64_t>(id.bits())); }
  static absl::StatusOr<GlobalId> From(const Value& v) {
    if (!v.is<int64_t>()) return KindMismatch(kName, v);
    const uint64_t bits = static_cast<uint64_t>(v.get<int64_t>());
    if (bits == 0) return GlobalId();
    std::optional<GlobalId> id = GlobalId::FromBits(bits);
    if (!id) return absl::InvalidArgumentError(absl::StrCat("expected an id, got the word ", bits));
    return *id;
  }
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_GLOBAL_ID_H_
