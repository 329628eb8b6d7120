#include "gradwire/rpc/errors.h"

#include "absl/strings/ascii.h"
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

bool NamesWorker(absl::string_view message, absl::string_view worker) {
  if (worker.empty()) return false;
  auto word = [](char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  const bool word_start = word(worker.front()), word_end = word(worker.back());
  for (size_t at = message.find(worker); at != absl::string_view::npos; at = message.find(worker, at + 1)) {
    const size_t end = at + worker.size();
    if (word_start && at > 0 && word(message[at - 1])) continue;
    if (word_end && end < message.size() && word(message[end])) continue;
    return true;
  }
  return false;
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
