#include "gradwire/rpc/value.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gw::rpc {

const char* Value::kind() const {
  static constexpr const char* kKinds[] = {"none",   "int",    "double", "bool",
                                           "string", "tensor", "list",   "map"};
  return kKinds[v_.index()];
}

std::string Value::DebugString() const {
  struct Visitor {
    std::string operator()(std::monostate) const { return "none"; }
    std::string operator()(int64_t v) const { return absl::StrCat(v); }
    std::string operator()(double v) const { return absl::StrCat(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return absl::StrCat("\"", v, "\""); }
    std::string operator()(const Tensor& t) const {
      return absl::StrCat("tensor(", DTypeName(t.dtype()), ShapeToString(t.sizes()), ")");
    }
    std::string operator()(const ValueList& l) const {
      std::vector<std::string> parts;
      for (const Value& v : l) parts.push_back(v.DebugString());
      return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
    }
    std::string operator()(const ValueMap& m) const {
      std::vector<std::string> parts;
      for (const auto& [k, v] : m) parts.push_back(absl::StrCat(k, ": ", v.DebugString()));
      return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
    }
  };
  return std::visit(Visitor{}, v_);
}

absl::Status KindMismatch(const char* expected, const Value& got) {
  return absl::InvalidArgumentError(absl::StrCat("expected ", expected, ", got ", got.kind()));
}

}  // namespace gw::rpc
