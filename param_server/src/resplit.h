// Internal: Resplit, a table's shards cut again for a new layout (Client::Reshard).
//
// Contract
//   - `old_forms`: every shard of one table in its checkpoint form (shard.h, without the
//     "<table>|" prefix), in the old layout's server order, each frozen at rest
//     (freeze.h: no open synchronous step). Returns one form per server of
//     `new_servers`, for layout `new_epoch`:
//       dense   the values and every per-key state buffer, concatenated in the old order
//               and cut by ShardDense(size, new_servers.size());
//       sparse  every row (values, state, step) placed by IdPlacement(new_servers);
//     every other field (header, optimizer, trainers and their clocks) from the first old
//     shard: the shards of a table frozen at one clock agree on them.
//   - DATA_LOSS when the forms disagree (a missing field, shapes that do not add up, an
//     open step's sums).
//   - A pure function.
#ifndef GRADWIRE_PARAM_SERVER_SRC_RESPLIT_H_
#define GRADWIRE_PARAM_SERVER_SRC_RESPLIT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "messages.h"

namespace gw::param_server::internal {

absl::StatusOr<std::vector<ShardForm>> Resplit(const std::vector<ShardForm>& old_forms,
                                               const std::vector<std::string>& new_servers, int64_t new_epoch);

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_RESPLIT_H_
