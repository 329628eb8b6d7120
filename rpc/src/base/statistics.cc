#include "gradwire/rpc/statistics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace gw::rpc {

namespace {

// Counts as integers, other values in the shortest form that reads back as the same
// double (a Unix time keeps its fraction of a second), NaN and infinities as Prometheus
// spells them.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::abs(v) < 9.0e15 && v == std::trunc(v)) return absl::StrCat(static_cast<int64_t>(v));
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : absl::StrFormat("%.17g", v);
}

}  // namespace

std::string ToText(const std::vector<Sample>& samples) {
  std::string out;
  for (const Sample& s : samples) {
    absl::StrAppend(&out, s.name);
    if (!s.labels.empty()) {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : s.labels) {
        absl::StrAppend(&out, first ? "" : ",", k, "=\"",
                        absl::StrReplaceAll(v, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}}), "\"");
        first = false;
      }
      out += '}';
    }
    absl::StrAppend(&out, " ", FormatValue(s.value), "\n");
  }
  return out;
}

}  // namespace gw::rpc
