// gw::Error: the exception thrown for programmer errors in tensor math.
//
// Contract
//   - Thrown for bad input to tensor operations: shape mismatches, dtype mismatches,
//     out-of-range indices or dimensions, use of an undefined tensor. The message names
//     the operation and the offending shapes/dtypes, e.g.
//       "Add: shapes [2, 3] and [4] cannot be broadcast".
//   - Never thrown across the wire: later layers turn it into an absl::Status.
//   - GW_CHECK(cond, "Op", parts...) throws gw::Error("Op: " + StrCat(parts...)) when
//     cond is false. The parts are only evaluated on failure.
#ifndef GRADWIRE_TENSOR_ERROR_H_
#define GRADWIRE_TENSOR_ERROR_H_

#include <stdexcept>
#include <string>

#include <sstream>
#include <string_view>

namespace gw {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace internal {
template <typename... Parts>
[[noreturn]] void Fail(std::string_view op, const Parts&... parts) {
  std::ostringstream os;
  os << op << ": ";
  (os << ... << parts);
  throw Error(os.str());
}
}  // namespace internal

}  // namespace gw

#define GW_CHECK(cond, op, ...)                       \
  do {                                                \
    if (!(cond)) [[unlikely]] {                       \
      ::gw::internal::Fail(op, __VA_ARGS__);          \
    }                                                 \
  } while (false)

#endif  // GRADWIRE_TENSOR_ERROR_H_
