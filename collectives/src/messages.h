// Internal: the messages of the collectives layer (process_group.h). Both go from one
// member of a group to another and are served inline on the receiver's I/O thread.
#ifndef GRADWIRE_COLLECTIVES_SRC_MESSAGES_H_
#define GRADWIRE_COLLECTIVES_SRC_MESSAGES_H_

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "gradwire/rpc/message.h"
#include "gradwire/tensor/tensor.h"

namespace gw::collectives::internal {

enum class Kind : int64_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kBarrier };

// What a member issued: every piece carries its sender's, and the receiver compares it
// with its own, so ranks that disagree fail instead of mixing up data.
struct Signature {
  int64_t kind = 0;   // Kind
  int64_t dtype = 0;  // DType
  int64_t op = 0;     // ReduceOp (reductions), the root (broadcast), else 0
  std::vector<int64_t> shape;
  // The algorithm the sender's options chose: 0 for the small one, else the ring's piece
  // size in bytes (members whose options differ would wait for steps never sent).
  int64_t algorithm = 0;
  static constexpr auto Fields() {
    return std::make_tuple(rpc::Field("kind", &Signature::kind), rpc::Field("dtype", &Signature::dtype),
                           rpc::Field("op", &Signature::op), rpc::Field("shape", &Signature::shape),
                           rpc::Field("algorithm", &Signature::algorithm));
  }
  bool operator==(const Signature&) const = default;
};

// One piece of data of step `step` of the group's collective number `seq`.
struct CollectiveChunk {
  static constexpr char kFunction[] = "__coll.chunk";
  using Reply = rpc::Ack;
  int64_t group = 0;
  int64_t seq = 0;
  int64_t step = 0;
  Signature signature;
  Tensor data;
  static constexpr auto Fields() {
    return std::make_tuple(rpc::Field("group", &CollectiveChunk::group), rpc::Field("seq", &CollectiveChunk::seq),
                           rpc::Field("step", &CollectiveChunk::step),
                           rpc::Field("signature", &CollectiveChunk::signature),
                           rpc::Field("data", &CollectiveChunk::data));
  }
};

// The sender failed collective `seq` (or, with `broken`, the group for good): the
// receiver fails it with the same code and message.
struct CollectiveAbort {
  static constexpr char kFunction[] = "__coll.abort";
  using Reply = rpc::Ack;
  int64_t group = 0;
  int64_t seq = 0;
  int64_t code = 0;  // absl::StatusCode
  std::string message;
  bool broken = false;
  static constexpr auto Fields() {
    return std::make_tuple(rpc::Field("group", &CollectiveAbort::group), rpc::Field("seq", &CollectiveAbort::seq),
                           rpc::Field("code", &CollectiveAbort::code),
                           rpc::Field("message", &CollectiveAbort::message),
                           rpc::Field("broken", &CollectiveAbort::broken));
  }
};

}  // namespace gw::collectives::internal

#endif  // GRADWIRE_COLLECTIVES_SRC_MESSAGES_H_
