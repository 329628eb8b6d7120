// Value: the dynamically typed arguments and results of remote calls, and the typed
// conversions that let users register and call plain C++ functions.
//
// Contract
//   - A Value is none, int64, double, bool, string, Tensor, a list of Values, a
//     string-keyed map of Values, an RRef (rref.h) or an Object. Tensors travel out of
//     band (raw buffers after the frame header), everything else inside the protobuf
//     envelope. An Object (a C++ object held by std::shared_ptr, e.g. a module) never
//     travels: it stays on the worker that made it and is reached through an RRef.
//   - ValueTraits<T> converts between Value and the C++ types a handler may take or
//     return: integral types, float/double, bool, std::string, Tensor, Value,
//     std::vector<T>, std::map<std::string, T>, std::optional<T> (none when empty), enums
//     (as their integer), RRef<T> (rref.h), records (message.h) and std::shared_ptr<C> of
//     a class C (an Object, checked by type name). From() reports a mismatch as
//     INVALID_ARGUMENT naming the expected and actual kinds; integers convert to double
//     but not the reverse.
//   - Thread safety: Values are plain data; Tensors inside share storage (see tensor.h).
#ifndef GRADWIRE_RPC_VALUE_H_
#define GRADWIRE_RPC_VALUE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "gradwire/tensor/tensor.h"

namespace gw::rpc {

class Value;
using ValueList = std::vector<Value>;
using ValueMap = std::map<std::string, Value>;

namespace internal {
class RRefState;  // rref.h
// The readable (demangled) name of T, e.g. "gw::Tensor"; the same in every process
// built by the same compiler.
std::string DemangledName(const std::type_info& type);
template <typename T>
std::string TypeName() {
  return DemangledName(typeid(T));
}
}  // namespace internal

using RRefPtr = std::shared_ptr<internal::RRefState>;

// A C++ object owned by this process, held by a Value (see the contract above).
struct Object {
  std::shared_ptr<void> ptr;
  std::string type;  // internal::TypeName of the object's class
};

class Value {
 public:
  using Storage = std::variant<std::monostate, int64_t, double, bool, std::string, Tensor,
                               ValueList, ValueMap, RRefPtr, Object>;

  Value() = default;
  template <typename I,
            std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  Value(I v) : v_(static_cast<int64_t>(v)) {}  // NOLINT(runtime/explicit)
  Value(double v) : v_(v) {}                  // NOLINT
  Value(bool v) : v_(v) {}                    // NOLINT
  Value(std::string v) : v_(std::move(v)) {}  // NOLINT
  Value(const char* v) : v_(std::string(v)) {}  // NOLINT
  Value(Tensor v) : v_(std::move(v)) {}       // NOLINT
  Value(ValueList v) : v_(std::move(v)) {}    // NOLINT
  Value(ValueMap v) : v_(std::move(v)) {}     // NOLINT
  Value(RRefPtr v) : v_(std::move(v)) {}      // NOLINT
  Value(Object v) : v_(std::move(v)) {}       // NOLINT

  const Storage& storage() const { return v_; }
  Storage& storage() { return v_; }
  // "none", "int", "double", "bool", "string", "tensor", "list", "map", "rref", "object".
  const char* kind() const;
  std::string DebugString() const;

  template <typename T>
  bool is() const { return std::holds_alternative<T>(v_); }
  template <typename T>
  const T& get() const { return std::get<T>(v_); }

 private:
  Storage v_;
};

absl::Status KindMismatch(const char* expected, const Value& got);

template <typename T, typename = void>
struct ValueTraits;

template <>
struct ValueTraits<Value> {
  static constexpr const char* kName = "value";
  static Value To(Value v) { return v; }
  static absl::StatusOr<Value> From(const Value& v) { return v; }
};

template <typename T>
struct ValueTraits<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static constexpr const char* kName = "int";
  static Value To(T v) { return Value(static_cast<int64_t>(v)); }
  static absl::StatusOr<T> From(const Value& v) {
    if (!v.is<int64_t>()) return KindMismatch(kName, v);
    return static_cast<T>(v.get<int64_t>());
  }
};

template <typename T>
struct ValueTraits<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static constexpr const char* kName = "double";
  static Value To(T v) { return Value(static_cast<double>(v)); }
  static absl::StatusOr<T> From(const Value& v) {
    if (v.is<double>()) return static_cast<T>(v.get<double>());
    if (v.is<int64_t>()) return static_cast<T>(v.get<int64_t>());
    return KindMismatch(kName, v);
  }
};

// Enums travel as their integer; receivers check the range they accept.
template <typename T>
struct ValueTraits<T, std::enable_if_t<std::is_enum_v<T>>> {
  static constexpr const char* kName = "int";
  static Value To(T v) { return Value(static_cast<int64_t>(v)); }
  static absl::StatusOr<T> From(const Value& v) {
    if (!v.is<int64_t>()) return KindMismatch(kName, v);
    return static_cast<T>(v.get<int64_t>());
  }
};

template <>
struct ValueTraits<bool> {
  static constexpr const char* kName = "bool";
  static Value To(bool v) { return Value(v); }
  static absl::StatusOr<bool> From(const Value& v) {
    if (!v.is<bool>()) return KindMismatch(kName, v);
    return v.get<bool>();
  }
};

template <>
struct ValueTraits<std::string> {
  static constexpr const char* kName = "string";
  static Value To(std::string v) { return Value(std::move(v)); }
  static absl::StatusOr<std::string> From(const Value& v) {
    if (!v.is<std::string>()) return KindMismatch(kName, v);
    return v.get<std::string>();
  }
};

template <>
struct ValueTraits<const char*> {
  static constexpr const char* kName = "string";
  static Value To(const char* v) { return Value(std::string(v)); }
};

template <>
struct ValueTraits<Tensor> {
  static constexpr const char* kName = "tensor";
  static Value To(Tensor v) { return Value(std::move(v)); }
  static absl::StatusOr<Tensor> From(const Value& v) {
    if (!v.is<Tensor>()) return KindMismatch(kName, v);
    return v.get<Tensor>();
  }
};

template <typename T>
struct ValueTraits<std::vector<T>> {
  static constexpr const char* kName = "list";
  static Value To(std::vector<T> v) {
    ValueList out;
    out.reserve(v.size());
    for (auto& e : v) out.push_back(ValueTraits<T>::To(std::move(e)));
    return Value(std::move(out));
  }
  static absl::StatusOr<std::vector<T>> From(const Value& v) {
    if (!v.is<ValueList>()) return KindMismatch(kName, v);
    std::vector<T> out;
    for (const Value& e : v.get<ValueList>()) {
      absl::StatusOr<T> x = ValueTraits<T>::From(e);
      if (!x.ok()) return x.status();
      out.push_back(std::move(*x));
    }
    return out;
  }
};

template <typename T>
struct ValueTraits<std::optional<T>> {
  static constexpr const char* kName = ValueTraits<T>::kName;
  static Value To(std::optional<T> v) { return v ? ValueTraits<T>::To(std::move(*v)) : Value(); }
  static absl::StatusOr<std::optional<T>> From(const Value& v) {
    if (v.is<std::monostate>()) return std::optional<T>();
    absl::StatusOr<T> x = ValueTraits<T>::From(v);
    if (!x.ok()) return x.status();
    return std::optional<T>(std::move(*x));
  }
};

template <typename T>
struct ValueTraits<std::map<std::string, T>> {
  static constexpr const char* kName = "map";
  static Value To(std::map<std::string, T> v) {
    ValueMap out;
    for (auto& [k, e] : v) out.emplace(k, ValueTraits<T>::To(std::move(e)));
    return Value(std::move(out));
  }
  static absl::StatusOr<std::map<std::string, T>> From(const Value& v) {
    if (!v.is<ValueMap>()) return KindMismatch(kName, v);
    std::map<std::string, T> out;
    for (const auto& [k, e] : v.get<ValueMap>()) {
      absl::StatusOr<T> x = ValueTraits<T>::From(e);
      if (!x.ok()) return x.status();
      out.emplace(k, std::move(*x));
    }
    return out;
  }
};

template <typename C>
struct ValueTraits<std::shared_ptr<C>, std::enable_if_t<std::is_class_v<C> && !std::is_same_v<C, Tensor>>> {
  static constexpr const char* kName = "object";
  static Value To(std::shared_ptr<C> v) { return Value(Object{std::move(v), internal::TypeName<C>()}); }
  static absl::StatusOr<std::shared_ptr<C>> From(const Value& v) {
    if (!v.is<Object>()) return KindMismatch(kName, v);
    const Object& o = v.get<Object>();
    if (o.type != internal::TypeName<C>()) {
      return absl::InvalidArgumentError("expected an object of type " + internal::TypeName<C>() +
                                        ", got one of type " + o.type);
    }
    return std::static_pointer_cast<C>(o.ptr);
  }
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_VALUE_H_
