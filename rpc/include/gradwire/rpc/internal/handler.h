// How a C++ callable becomes a handler of raw values (internal, for agent.h): the
// argument and result types of functions, lambdas and std::functions (FnTraits,
// IsStdFunction), the conversion of a call's values to its arguments (ArgsFromValues),
// and of whatever a handler returns (T, absl::Status, absl::StatusOr<T>, Future<T>) to
// the Future<Value> of the answer (ResultAdapter, MakeHandler, AdaptReply).
//
// Contract
//   - MakeHandler(executor, fn): a RawHandler that checks the number and types of the
//     arguments (INVALID_ARGUMENT naming the function and the argument) before calling fn.
//   - Header-only templates; nothing here is part of the public API.
#ifndef GRADWIRE_RPC_INTERNAL_HANDLER_H_
#define GRADWIRE_RPC_INTERNAL_HANDLER_H_

#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gradwire/rpc/executor.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/worker.h"

namespace gw::rpc {

namespace internal {

template <typename T>
struct FnTraits : FnTraits<decltype(&T::operator())> {};
template <typename C, typename R, typename... A>
struct FnTraits<R (C::*)(A...) const> {
  using Ret = R;
  using Args = std::tuple<std::decay_t<A>...>;
};
template <typename C, typename R, typename... A>
struct FnTraits<R (C::*)(A...)> : FnTraits<R (C::*)(A...) const> {};
template <typename R, typename... A>
struct FnTraits<R (*)(A...)> {
  using Ret = R;
  using Args = std::tuple<std::decay_t<A>...>;
};

template <typename Tuple, size_t... I>
absl::Status ArgsFromValues([[maybe_unused]] const ValueList& args, [[maybe_unused]] Tuple* out,
                            std::index_sequence<I...>) {
  absl::Status status;
  [[maybe_unused]] auto one = [&](auto index, auto& slot) {
    if (!status.ok()) return;
    constexpr size_t i = decltype(index)::value;
    using T = std::decay_t<decltype(slot)>;
    absl::StatusOr<T> v = ValueTraits<T>::From(args[i]);
    if (!v.ok()) {
      status = absl::InvalidArgumentError(absl::StrCat("argument ", i + 1, ": ", v.status().message()));
    } else {
      slot = std::move(*v);
    }
  };
  (one(std::integral_constant<size_t, I>{}, std::get<I>(*out)), ...);
  return status;
}

// Turns whatever a handler returned into a Future<Value>.
template <typename R>
struct ResultAdapter {
  static Future<Value> Adapt(Executor& ex, R r) { return MakeReadyFuture<Value>(ex, ValueTraits<R>::To(std::move(r))); }
};
template <>
struct ResultAdapter<absl::Status> {
  static Future<Value> Adapt(Executor& ex, absl::Status s) {
    return MakeReadyFuture<Value>(ex, s.ok() ? absl::StatusOr<Value>(Value()) : absl::StatusOr<Value>(s));
  }
};
template <typename T>
struct ResultAdapter<absl::StatusOr<T>> {
  static Future<Value> Adapt(Executor& ex, absl::StatusOr<T> r) {
    if (!r.ok()) return MakeReadyFuture<Value>(ex, r.status());
    return MakeReadyFuture<Value>(ex, ValueTraits<T>::To(std::move(*r)));
  }
};
template <typename T>
struct ResultAdapter<Future<T>> {
  // Converted on the thread that completes the handler's future: no thread hop.
  static Future<Value> Adapt(Executor&, Future<T> f) {
    if constexpr (std::is_same_v<T, Value>) {
      return f;
    } else {
      return Map<Value>(f, [](const absl::StatusOr<T>& r) -> absl::StatusOr<Value> {
        if (!r.ok()) return r.status();
        return ValueTraits<T>::To(*r);
      });
    }
  }
};

template <typename F>
RawHandler MakeHandler(F fn, Executor& ex) {
  using Traits = FnTraits<std::decay_t<F>>;
  using Args = typename Traits::Args;
  using Ret = typename Traits::Ret;
  return [fn = std::move(fn), &ex](const CallInfo& info, ValueList values) -> Future<Value> {
    constexpr size_t n = std::tuple_size_v<Args>;
    if (values.size() != n) {
      return MakeReadyFuture<Value>(ex, absl::InvalidArgumentError(absl::StrCat("'", info.function, "' takes ", n,
                                                                                " argument(s), got ", values.size())));
    }
    Args args;
    if (absl::Status s = ArgsFromValues(values, &args, std::make_index_sequence<n>{}); !s.ok()) {
      return MakeReadyFuture<Value>(ex,
                                    absl::InvalidArgumentError(absl::StrCat("'", info.function, "' ", s.message())));
    }
    if constexpr (std::is_void_v<Ret>) {
      std::apply(fn, std::move(args));
      return MakeReadyFuture<Value>(ex, Value());
    } else {
      return ResultAdapter<Ret>::Adapt(ex, std::apply(fn, std::move(args)));
    }
  };
}

// What a protocol handler returns (Reply, absl::StatusOr<Reply>, Future<Reply>, or
// absl::Status when Reply is Ack), as the Future<Value> of the answer.
template <typename M, typename R>
Future<Value> AdaptReply(Executor& ex, R r) {
  if constexpr (std::is_same_v<R, absl::Status>) {
    static_assert(std::is_same_v<typename M::Reply, Ack>,
                  "only a message answered by Ack may have a handler returning Status");
    return MakeReadyFuture<Value>(
        ex, r.ok() ? absl::StatusOr<Value>(ValueTraits<Ack>::To(Ack{})) : absl::StatusOr<Value>(r));
  } else {
    return ResultAdapter<R>::Adapt(ex, std::move(r));
  }
}

// The handler of protocol message M: decodes M from the call's arguments (after the
// owned value of type Self, for a method message) and runs fn(info, M) or fn(info, self, M).
template <typename M, typename Self, typename F>
RawHandler MakeProtocolHandler(F fn, Executor& ex) {
  constexpr bool kMethod = !std::is_void_v<Self>;
  return [fn = std::move(fn), &ex](const CallInfo& info, ValueList values) -> Future<Value> {
    auto refuse = [&](absl::string_view why) {
      return MakeReadyFuture<Value>(
          ex, absl::InvalidArgumentError(absl::StrCat(info.function, " from ", info.caller, ": ", why)));
    };
    if constexpr (kMethod) {
      if (values.empty()) return refuse("no value to call the method on");
      absl::StatusOr<Self> self = ValueTraits<Self>::From(values[0]);
      if (!self.ok()) return refuse(self.status().message());
      absl::StatusOr<M> m = ValueTraits<M>::FromList(
          ValueList(std::make_move_iterator(values.begin() + 1), std::make_move_iterator(values.end())));
      if (!m.ok()) return refuse(m.status().message());
      return AdaptReply<M>(ex, fn(info, *std::move(self), *std::move(m)));
    } else {
      absl::StatusOr<M> m = ValueTraits<M>::FromList(values);
      if (!m.ok()) return refuse(m.status().message());
      return AdaptReply<M>(ex, fn(info, *std::move(m)));
    }
  };
}

// Appends a call argument converted with ValueTraits; a CallOptions sets the options.
template <typename A>
void AddArg(ValueList* values, CallOptions* options, A&& a) {
  if constexpr (std::is_same_v<std::decay_t<A>, CallOptions>) {
    *options = a;
  } else {
    values->push_back(ValueTraits<std::decay_t<A>>::To(std::forward<A>(a)));
  }
}

template <typename R>
absl::StatusOr<R> ConvertResult(absl::StatusOr<Value> v, const std::string& to, const std::string& function) {
  if (!v.ok()) return v.status();
  if constexpr (std::is_same_v<R, Value>) {
    return std::move(*v);
  } else {
    absl::StatusOr<R> r = ValueTraits<R>::From(*v);
    if (!r.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("result of ", to, ".", function, ": ", r.status().message()));
    }
    return r;
  }
}

}  // namespace internal

namespace internal {
template <typename F>
struct IsStdFunction : std::false_type {};
template <typename R, typename... A>
struct IsStdFunction<std::function<R(A...)>> : std::true_type {};
}  // namespace internal

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_INTERNAL_HANDLER_H_
