#include "call_table.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gw::rpc::internal {

CallTable::CallTable(TimerQueue& timers, std::function<std::string(int)> describe)
    : timers_(timers), describe_(std::move(describe)) {}

CallTable::~CallTable() { Close(absl::CancelledError("the call table was destroyed")); }

uint64_t CallTable::Add(int rank, std::string function, absl::Duration timeout, Done done, size_t* in_flight) {
  absl::Status closed;
  {
    absl::MutexLock lock(&mu_);
    if (in_flight != nullptr) *in_flight = pending_.size();
    if (closed_.ok()) {
      const uint64_t id = next_id_++;
      Pending& p = pending_.emplace(id, Pending{std::move(done), rank, std::move(function), timeout, {}}).first->second;
      // Armed under the lock (the timer queue runs callbacks without its own lock), so an
      // expiry always finds the entry or finds it completed. The queue outlives the table's
      // Close, so it never runs the callback here.
      p.timer = timers_.After(timeout, [this, id] { Expire(id); });
      return id;
    }
    closed = closed_;
  }
  done(closed);
  return 0;
}

bool CallTable::Complete(uint64_t id, absl::StatusOr<Value> result) {
  Done done;
  TimerQueue::Handle timer;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return false;
    done = std::move(it->second.done);
    timer = it->second.timer;
    pending_.erase(it);
  }
  timers_.Cancel(timer);
  done(std::move(result));
  return true;
}

std::optional<CallTable::Call> CallTable::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return std::nullopt;
  return Call{it->second.rank, it->second.function};
}

void CallTable::Expire(uint64_t id) {
  Pending p;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    p = std::move(it->second);
    pending_.erase(it);
  }
  p.done(absl::DeadlineExceededError(absl::StrCat("call to ", describe_(p.rank), ".", p.function, " timed out after ",
                                                  absl::FormatDuration(p.timeout))));
}

void CallTable::FailPeer(int rank, const absl::Status& why) {
  std::vector<Pending> failed;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.rank == rank) {
        failed.push_back(std::move(it->second));
        pending_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  const absl::StatusCode code =
      why.code() == absl::StatusCode::kFailedPrecondition ? why.code() : absl::StatusCode::kUnavailable;
  for (Pending& p : failed) {
    timers_.Cancel(p.timer);
    p.done(absl::Status(code, absl::StrCat("call to ", describe_(rank), ".", p.function, " failed: ", why.message())));
  }
}

void CallTable::Close(const absl::Status& why) {
  std::vector<Pending> failed;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return;
    closed_ = why.ok() ? absl::CancelledError("the call table is closed") : why;
    for (auto& [id, p] : pending_) failed.push_back(std::move(p));
    pending_.clear();
  }
  for (Pending& p : failed) {
    timers_.Cancel(p.timer);
    p.done(why);
  }
}

size_t CallTable::size() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

bool CallTable::AwaitEmpty(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_.empty(); };
  return mu_.AwaitWithDeadline(absl::Condition(&empty), deadline);
}

}  // namespace gw::rpc::internal
