// Typed messages: how gradwire's own layers (RRefs, distributed autograd, the parameter
// server, remote modules) talk to their peers, each message a type that the sender and
// the receiver share.
//
// Contract
//   - A record is a struct that names its fields once, in Fields(): a tuple of (name,
//     member pointer) pairs, made with Field() or, by layers that know no networking
//     (optim's configs), with std::pair directly:
//
//       struct RRefFork {
//         static constexpr char kFunction[] = "__rref.fork";  // protocol messages only
//         using Reply = Ack;
//         GlobalId rref;
//         GlobalId fork;
//         static constexpr auto Fields() {
//           return std::make_tuple(Field("rref", &RRefFork::rref), Field("fork", &RRefFork::fork));
//         }
//       };
//
//     Every field type has ValueTraits (value.h; records nest). ValueTraits<Record>
//     encodes a record as the list of its fields in Fields() order and decodes it with the
//     same table, checking the count and every field's kind; a mismatch is
//     INVALID_ARGUMENT naming the record and the field ("RRefFork.fork: expected id, got
//     string"). No code decodes a message by position by hand.
//   - std::variant<Records...> travels as [alternative's name, its fields] and is decoded
//     by that name (e.g. optim::OptimizerConfig).
//   - A protocol message is a record with kFunction, a name in the reserved namespace
//     (IsReservedName: it starts with "__"), and a Reply type with ValueTraits (Ack when
//     the answer only says "done"). Agent::Handle<M> serves it, Agent::Send<M> sends it; a
//     message's fields are the call's arguments, so a registered function taking the same
//     parameters in the same order could serve it too (RRef method calls rely on this).
//   - Users cannot Register a reserved name (INVALID_ARGUMENT, agent.h), so no user
//     function can shadow or intercept a protocol.
//   - kProtocolVersion is the version of every message of every layer, exchanged in the
//     hello of each connection: a peer whose version is not in [kMinProtocolVersion,
//     kProtocolVersion] is refused at connect time with an error naming both versions.
//     Bump it when any message's fields change.
#ifndef GRADWIRE_RPC_MESSAGE_H_
#define GRADWIRE_RPC_MESSAGE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gradwire/rpc/value.h"

namespace gw::rpc {

// 3: heartbeat frames (PING / PONG envelopes). 4: the hello carries the worker's address
// and pid (workers join running groups). 5: envelopes name their tensors' devices
// (device maps; a peer of 4 would put every GPU tensor on its CPU).
inline constexpr int kProtocolVersion = 5;
inline constexpr int kMinProtocolVersion = 5;
inline constexpr char kReservedPrefix[] = "__";

constexpr bool IsReservedName(std::string_view name) { return name.substr(0, 2) == std::string_view(kReservedPrefix); }

template <typename M, typename T>
constexpr std::pair<const char*, T M::*> Field(const char* name, T M::*member) {
  return {name, member};
}

template <typename M>
concept Record = requires { M::Fields(); };

template <typename M>
concept ProtocolMessage = Record<M> && requires {
  { M::kFunction } -> std::convertible_to<const char*>;
  typename M::Reply;
};

// The reply of a message that only says "done".
struct Ack {
  static constexpr auto Fields() { return std::tuple<>(); }
};

namespace internal {

// "RRefFork" for gw::rpc::internal::RRefFork.
template <typename M>
std::string RecordName() {
  std::string name = TypeName<M>();
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

}  // namespace internal

template <Record M>
struct ValueTraits<M> {
  static constexpr const char* kName = "record";
  static constexpr size_t kCount = std::tuple_size_v<decltype(M::Fields())>;

  static Value To(M m) {
    ValueList out;
    out.reserve(kCount);
    std::apply([&](auto... f) { (out.push_back(ValueTraits<FieldType<decltype(f)>>::To(std::move(m.*(f.second)))), ...); },
               M::Fields());
    return Value(std::move(out));
  }
  static absl::StatusOr<M> From(const Value& v) {
    if (!v.is<ValueList>()) return Mismatch(KindMismatch("a list of fields", v).message());
    return FromList(v.get<ValueList>());
  }
  static absl::StatusOr<M> FromList(const ValueList& fields) {
    if (fields.size() != kCount) {
      return Mismatch(absl::StrCat("expected ", kCount, " fields, got ", fields.size(),
                                   " (does the peer speak another protocol version?)"));
    }
    M m;
    absl::Status status;
    size_t i = 0;
    std::apply([&](auto... f) { (Decode(fields[i++], f, m, status), ...); }, M::Fields());
    if (!status.ok()) return status;
    return m;
  }

 private:
  template <typename F>
  using FieldType = std::decay_t<decltype(std::declval<M&>().*(std::declval<F>().second))>;

  template <typename F>
  static void Decode(const Value& v, const F& f, M& m, absl::Status& status) {
    if (!status.ok()) return;
    absl::StatusOr<FieldType<F>> x = ValueTraits<FieldType<F>>::From(v);
    if (!x.ok()) {
      status = absl::InvalidArgumentError(absl::StrCat(internal::RecordName<M>(), ".", f.first, ": ", x.status().message()));
      return;
    }
    m.*(f.second) = std::move(*x);
  }
  static absl::Status Mismatch(absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(internal::RecordName<M>(), ": ", why));
  }
};

template <Record... Ts>
struct ValueTraits<std::variant<Ts...>> {
  static constexpr const char* kName = "variant";
  static Value To(std::variant<Ts...> v) {
    return std::visit(
        [](auto& x) {
          using T = std::decay_t<decltype(x)>;
          return Value(ValueList{Value(internal::RecordName<T>()), ValueTraits<T>::To(std::move(x))});
        },
        v);
  }
  static absl::StatusOr<std::variant<Ts...>> From(const Value& v) {
    if (!v.is<ValueList>() || v.get<ValueList>().size() != 2 || !v.get<ValueList>()[0].is<std::string>()) {
      return absl::InvalidArgumentError(absl::StrCat("expected [name, fields] of one of ", Names(), ", got ", v.kind()));
    }
    const std::string& name = v.get<ValueList>()[0].get<std::string>();
    absl::StatusOr<std::variant<Ts...>> out =
        absl::InvalidArgumentError(absl::StrCat("'", name, "' is not one of ", Names()));
    (TryAlternative<Ts>(name, v.get<ValueList>()[1], out), ...);
    return out;
  }

 private:
  template <typename T>
  static void TryAlternative(const std::string& name, const Value& fields, absl::StatusOr<std::variant<Ts...>>& out) {
    if (name != internal::RecordName<T>()) return;
    absl::StatusOr<T> x = ValueTraits<T>::From(fields);
    if (x.ok()) {
      out = std::variant<Ts...>(*std::move(x));
    } else {
      out = x.status();
    }
  }
  static std::string Names() {
    std::string out;
    ((out += (out.empty() ? "" : ", ") + internal::RecordName<Ts>()), ...);
    return out;
  }
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_MESSAGE_H_
