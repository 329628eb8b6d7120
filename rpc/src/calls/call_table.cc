#include "calls/call_table.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gw::rpc::internal {

CallTable::CallTable(TimerQueue& timers, std::function<std::string(int)> describe, Tracer* tracer, int self_rank)
    : timers_(timers), describe_(std::move(describe)), tracer_(tracer), self_rank_(self_rank) {
  if (tracer_ != nullptr && tracer_->enabled()) {
    reply_category_ = tracer_->Intern("rpc.reply");
    peer_arg_ = tracer_->Intern("peer");
    latency_arg_ = tracer_->Intern("call_us");
  }
}

CallTable::~CallTable() { Close(absl::CancelledError("the call table was destroyed")); }

void CallTable::Pending::Finish(CallTable& table, absl::StatusOr<Value> result, uint64_t received_bytes) {
  if (series != nullptr) {
    series->Received(received_bytes);
    series->Record(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), result.ok());
  }
  Tracer* tracer = table.tracer_;
  if (tracer == nullptr || traced.begin_us == 0 || !tracer->enabled()) {
    done(std::move(result));
    return;
  }
  // The completion: a slice on the completing thread (running `done`), where the reply's
  // flow ends; the call's whole time, from Add, is its argument.
  const int64_t completed = tracer->Now();
  Tracer::Span reply{.category = table.reply_category_,
                     .name = traced.name,
                     .begin_us = completed,
                     .flow_in = received_bytes > 0 ? Tracer::ReplyFlow(table.self_rank_, id) : 0,
                     .arg_names = {table.peer_arg_, table.latency_arg_},
                     .arg_values = {rank, completed - traced.begin_us},
                     .context = traced.context};
  if (!result.ok()) {
    const absl::string_view why = result.status().message();
    reply.note = tracer->Intern(std::string_view(why.data(), why.size()));
  }
  done(std::move(result));
  reply.end_us = tracer->Now();
  tracer->Record(reply);
}

uint64_t CallTable::Add(int rank, std::string function, absl::Duration timeout, Done done, size_t* in_flight,
                        CallMetrics::Series* series, TracedStart traced) {
  const absl::Time when = absl::Now() + timeout;
  const auto start = std::chrono::steady_clock::now();
  if (traced.begin_us == 0 && tracer_ != nullptr && tracer_->enabled()) {
    traced = {.begin_us = tracer_->Now(), .name = tracer_->Intern(function), .context = tracer_->CurrentContext()};
  }
  absl::Status closed;
  {
    absl::MutexLock lock(&mu_);
    if (in_flight != nullptr) *in_flight = pending_.size();
    if (closed_.ok()) {
      const uint64_t id = next_id_++;
      pending_.emplace(id, Pending{std::move(done), rank, std::move(function), timeout, series, start, id, traced});
      if (when != absl::InfiniteFuture()) {
        deadlines_.push_back({when, id});
        std::push_heap(deadlines_.begin(), deadlines_.end(), std::greater<>());
        ArmEarliest();
      }
      return id;
    }
    closed = closed_;
  }
  if (series != nullptr) series->Record(0, /*ok=*/false);
  done(closed);
  return 0;
}

void CallTable::ArmEarliest() {
  if (deadlines_.empty()) return;
  const absl::Time earliest = deadlines_.front().when;
  if (!armed_.empty() && armed_.when <= earliest) return;
  if (!armed_.empty()) timers_.Cancel(armed_);  // a callback already running finds nothing due
  // The queue outlives the table's Close, so At never runs the callback here.
  armed_ = timers_.At(earliest, [this, earliest] { OnTimer(earliest); });
}

void CallTable::Forget() {
  // An armed timer is left to fire when nothing is pending: the next call's deadline is
  // later, so a caller making one call at a time arms no timer per call.
  if (pending_.empty()) {
    deadlines_.clear();
  } else if (deadlines_.size() > 64 && deadlines_.size() > 2 * pending_.size()) {
    std::erase_if(deadlines_,
                  [this](const Deadline& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !pending_.contains(d.id); });
    std::make_heap(deadlines_.begin(), deadlines_.end(), std::greater<>());
  }
}

bool CallTable::Complete(uint64_t id, absl::StatusOr<Value> result, uint64_t received_bytes) {
  std::optional<Pending> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return false;
    call.emplace(std::move(it->second));
    pending_.erase(it);
    Forget();
  }
  call->Finish(*this, std::move(result), received_bytes);
  return true;
}

std::optional<CallTable::Call> CallTable::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return std::nullopt;
  return Call{it->second.rank, it->second.function};
}

void CallTable::OnTimer(absl::Time armed_for) {
  std::vector<Pending> expired;
  {
    absl::MutexLock lock(&mu_);
    if (!armed_.empty() && armed_.when == armed_for) armed_ = {};
    const absl::Time now = absl::Now();
    while (!deadlines_.empty() && deadlines_.front().when <= now) {
      std::pop_heap(deadlines_.begin(), deadlines_.end(), std::greater<>());
      auto it = pending_.find(deadlines_.back().id);
      deadlines_.pop_back();
      if (it == pending_.end()) continue;  // completed before its deadline
      expired.push_back(std::move(it->second));
      pending_.erase(it);
    }
    Forget();
    ArmEarliest();
  }
  for (Pending& p : expired) {
    p.Finish(*this, absl::DeadlineExceededError(absl::StrCat("call to ", describe_(p.rank), ".", p.function,
                                                             " timed out after ", absl::FormatDuration(p.timeout))));
  }
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
    Forget();
  }
  const absl::StatusCode code =
      why.code() == absl::StatusCode::kFailedPrecondition ? why.code() : absl::StatusCode::kUnavailable;
  for (Pending& p : failed) {
    p.Finish(*this, absl::Status(
                        code, absl::StrCat("call to ", describe_(rank), ".", p.function, " failed: ", why.message())));
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
    deadlines_.clear();
    if (!armed_.empty()) timers_.Cancel(armed_);
    armed_ = {};
  }
  for (Pending& p : failed) p.Finish(*this, why);
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

void CallTable::AppendWaits(std::vector<Wait>& out) const {
  constexpr size_t kMostListed = 16;
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<double, Wait>> oldest;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, p] : pending_) {
      const double seconds = std::chrono::duration<double>(now - p.start).count();
      if (oldest.size() == kMostListed && seconds <= oldest.back().first) continue;
      Wait w{.layer = "rpc",
             .state = "waits",
             .what = absl::StrCat("call '", p.function, "'"),
             .on = {p.rank},
             .seconds = seconds};
      oldest.emplace_back(seconds, std::move(w));
      std::sort(oldest.begin(), oldest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      if (oldest.size() > kMostListed) oldest.pop_back();
    }
  }
  for (auto& [seconds, w] : oldest) out.push_back(std::move(w));
}

}  // namespace gw::rpc::internal
