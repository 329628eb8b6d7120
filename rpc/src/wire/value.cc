#include "gradwire/rpc/value.h"

#include <cxxabi.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/rpc/internal/rref_state.h"

namespace gw::rpc {

const char* Value::kind() const {
  static constexpr const char* kKinds[] = {"none",   "int",  "double", "bool", "string",
                                           "tensor", "list", "map",    "rref", "object"};
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
    std::string operator()(const RRefPtr& r) const {
      if (!r) return "rref(null)";
      const internal::RRefDescriptor& d = r->descriptor();
      return absl::StrCat("rref(", d.type, " #", d.rref_id.ToString(), " owned by rank ", d.owner, ")");
    }
    std::string operator()(const Object& o) const { return absl::StrCat("object(", o.type, ")"); }
    std::string operator()(const ValueMap& m) const {
      std::vector<std::string> parts;
      for (const auto& [k, v] : m) parts.push_back(absl::StrCat(k, ": ", v.DebugString()));
      return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
    }
  };
  return std::visit(Visitor{}, v_);
}

std::string internal::DemangledName(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : type.name();
  std::free(name);
  return out;
}

absl::Status KindMismatch(const char* expected, const Value& got) {
  return absl::InvalidArgumentError(absl::StrCat("expected ", expected, ", got ", got.kind()));
}

}  // namespace gw::rpc
