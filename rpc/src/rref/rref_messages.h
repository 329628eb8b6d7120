// Internal: the messages of the RRef protocol (rpc/include/gradwire/rpc/rref.h explains
// the protocol; this file is its vocabulary). Each is a record (message.h) that the
// sender and the receiver share.
#ifndef GRADWIRE_RPC_SRC_RREF_RREF_MESSAGES_H_
#define GRADWIRE_RPC_SRC_RREF_RREF_MESSAGES_H_

#include <string>
#include <tuple>
#include <vector>

#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/value.h"

namespace gw::rpc::internal {

// user -> owner: create the value by running `function(args)` (after the owned value
// `self_rref` when it is set: a method call whose result stays on the owner), and add
// `fork`. Acknowledged before the function finishes.
struct RRefRemote {
  static constexpr char kFunction[] = "__rref.remote";
  using Reply = Ack;
  GlobalId rref;
  GlobalId fork;
  std::string function;
  ValueList args;
  GlobalId self_rref;
  std::string type;  // TypeName<T>() of the value
  static constexpr auto Fields() {
    return std::make_tuple(Field("rref", &RRefRemote::rref), Field("fork", &RRefRemote::fork),
                           Field("function", &RRefRemote::function), Field("args", &RRefRemote::args),
                           Field("self_rref", &RRefRemote::self_rref), Field("type", &RRefRemote::type));
  }
};

// user -> owner: the value, copied (ToHere).
struct RRefFetch {
  static constexpr char kFunction[] = "__rref.fetch";
  using Reply = Value;
  GlobalId rref;
  static constexpr auto Fields() { return std::make_tuple(Field("rref", &RRefFetch::rref)); }
};

// user -> owner: run the registered function `method(value, args...)` there.
struct RRefCall {
  static constexpr char kFunction[] = "__rref.call";
  using Reply = Value;
  GlobalId rref;
  std::string method;
  ValueList args;
  static constexpr auto Fields() {
    return std::make_tuple(Field("rref", &RRefCall::rref), Field("method", &RRefCall::method),
                           Field("args", &RRefCall::args));
  }
};

// new user -> owner: add `fork` (creating the entry if the REMOTE has not arrived yet).
struct RRefFork {
  static constexpr char kFunction[] = "__rref.fork";
  using Reply = Ack;
  GlobalId rref;
  GlobalId fork;
  static constexpr auto Fields() {
    return std::make_tuple(Field("rref", &RRefFork::rref), Field("fork", &RRefFork::fork));
  }
};

// new user (or owner) -> parent: the child `fork` is known to the owner; the parent's
// `parent_fork` may now be released.
struct RRefAccept {
  static constexpr char kFunction[] = "__rref.accept";
  using Reply = Ack;
  GlobalId parent_fork;
  GlobalId fork;
  static constexpr auto Fields() {
    return std::make_tuple(Field("parent_fork", &RRefAccept::parent_fork), Field("fork", &RRefAccept::fork));
  }
};

// One fork of one owned value.
struct ForkOf {
  GlobalId rref;
  GlobalId fork;
  static constexpr auto Fields() { return std::make_tuple(Field("rref", &ForkOf::rref), Field("fork", &ForkOf::fork)); }
};

// user -> owner, batched per owner: drop these forks.
struct RRefDelete {
  static constexpr char kFunction[] = "__rref.delete";
  using Reply = Ack;
  std::vector<ForkOf> forks;
  static constexpr auto Fields() { return std::make_tuple(Field("forks", &RRefDelete::forks)); }
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_RREF_RREF_MESSAGES_H_
