#include "gradwire/rpc/errors.h"

#include "absl/strings/str_cat.h"
#include "gradwire/tensor/error.h"

namespace gw::rpc {

absl::Status ShuttingDownError(absl::string_view worker, absl::string_view what) {
  return absl::CancelledError(what.empty() ? absl::StrCat(worker, " is shutting down")
                                           : absl::StrCat(worker, " is shutting down: ", what));
}

absl::Status DeclaredDeadError(absl::string_view peer) {
  return UnavailableError(peer, "it was declared dead when its connection closed");
}

absl::Status UnavailableError(absl::string_view peer, absl::string_view detail) {
  return absl::UnavailableError(absl::StrCat(peer, " is unavailable: ", detail));
}

absl::Status StatusFromException(absl::string_view where) {
  try {
    throw;
  } catch (const gw::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, " threw: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(where, " threw: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(where, " threw an exception that is not a std::exception"));
  }
}

}  // namespace gw::rpc
