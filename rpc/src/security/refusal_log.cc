#include "security/refusal_log.h"

#include <cstdio>

namespace gw::rpc::internal {

void RefusalLog::Refused(const std::string& from, const absl::Status& why) {
  int64_t suppressed = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - window_ >= absl::Seconds(1)) {
      window_ = now;
      lines_ = 0;
      suppressed = suppressed_;
      suppressed_ = 0;
    }
    if (lines_ >= kLinesPerSecond) {
      ++suppressed_;
      return;
    }
    ++lines_;
  }
  if (suppressed > 0) {
    std::fprintf(stderr, "gradwire: refused %lld more of %s in the last second (not logged one by one)\n",
                 static_cast<long long>(suppressed), what_.c_str());
  }
  std::fprintf(stderr, "gradwire: refused %s from %s: %s\n", what_.c_str(), from.c_str(),
               std::string(why.message()).c_str());
}

}  // namespace gw::rpc::internal
