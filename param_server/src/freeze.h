// Internal: a shard's freeze while its table is re-sharded (Client::Reshard; server.cc
// serves the messages).
//
// Contract (every function REQUIRES the shard's mutex)
//   - A shard frozen at clock F (Shard::frozen_at) refuses, with ABORTED, the pushes of
//     clocks >= F (of an asynchronous table: every push) and the pulls that could only be
//     answered after step F (synchronous: clock > F; bounded staleness: clock - s > F).
//     Everything else is served: the steps before F complete, so every shard of the
//     table comes to rest at the same clock.
//   - FreezeProposal: the clock it would freeze at now (synchronous: the open step, or
//     the next one when the open step has pushes; bounded staleness: the furthest
//     trainer's clock; asynchronous: 0).
//   - Quiescent: frozen, and every step (every trainer's push) before F is in: the data
//     is final and may be exported.
//   - A retired shard (replaced by a new layout's, or its table moved away) refuses
//     everything.
#ifndef GRADWIRE_PARAM_SERVER_SRC_FREEZE_H_
#define GRADWIRE_PARAM_SERVER_SRC_FREEZE_H_

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "shard.h"

namespace gw::param_server::internal {

inline int64_t FreezeProposal(const Shard& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  switch (s.config.consistency) {
    case Consistency::kSync: return s.clock.applied() + (s.clock.pushed().empty() ? 0 : 1);
    case Consistency::kBoundedStaleness: return s.clock.JoinHint();
    case Consistency::kAsync: return 0;
  }
  return 0;
}

inline bool Quiescent(const Shard& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (s.frozen_at == Shard::kNotFrozen || s.frozen_at == Shard::kRetired) return false;
  switch (s.config.consistency) {
    case Consistency::kSync: return s.clock.applied() >= s.frozen_at && s.clock.pushed().empty();
    case Consistency::kBoundedStaleness: {
      const int64_t at = s.frozen_at;
      return std::all_of(s.clock.trainers().begin(), s.clock.trainers().end(),
                         [at](const auto& t) { return t.second.next >= at || t.second.until < at; });
    }
    case Consistency::kAsync: return true;
  }
  return false;
}

// OK, or ABORTED saying why the request must wait for the table's next layout.
inline absl::Status FrozenRefusal(const std::string& where, const Shard& s, bool push, int64_t clock)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (s.frozen_at == Shard::kNotFrozen) return absl::OkStatus();
  if (s.frozen_at == Shard::kRetired) {
    return absl::AbortedError(absl::StrCat(where, " was replaced by a new layout of the table (re-sharded): "
                                                  "the client re-reads the layout"));
  }
  bool refused = false;
  switch (s.config.consistency) {
    case Consistency::kSync: refused = push ? clock >= s.frozen_at : clock > s.frozen_at; break;
    case Consistency::kBoundedStaleness:
      refused = push ? clock >= s.frozen_at : clock - s.config.staleness > s.frozen_at;
      break;
    case Consistency::kAsync: refused = push; break;
  }
  if (!refused) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(where, " is being re-sharded (frozen at clock ", s.frozen_at,
                                         "): the client sends this again once the new layout is in place"));
}

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_FREEZE_H_
