// Internal: RefusalLog, the log lines of refused peers (security.h: every refusal is
// logged with its reason) without letting a flood of strangers flood the log: at most 10
// lines a second per log; the refusals past that are counted and reported in one line
// once the next second begins. Thread-safe.
#ifndef GRADWIRE_RPC_SRC_SECURITY_REFUSAL_LOG_H_
#define GRADWIRE_RPC_SRC_SECURITY_REFUSAL_LOG_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gw::rpc::internal {

class RefusalLog {
 public:
  // `what`: what is refused, as the line says it ("a connection", "a call to the store").
  explicit RefusalLog(std::string what) : what_(std::move(what)) {}
  void Refused(const std::string& from, const absl::Status& why);

 private:
  static constexpr int kLinesPerSecond = 10;
  const std::string what_;
  absl::Mutex mu_;
  absl::Time window_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int lines_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_SECURITY_REFUSAL_LOG_H_
