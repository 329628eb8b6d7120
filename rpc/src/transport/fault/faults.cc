#include "gradwire/rpc/faults.h"

#include <algorithm>
#include <cstdlib>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace gw::rpc {
namespace {

constexpr char kValidForms[] =
    "valid: drop:P, delay:D, delay:D1-D2, duplicate:P, reorder:W, corrupt:P, stall:D (or stall:inf), "
    "stall_after:N, close_after:N, partition:a+b/c+d, rto:D, seed:N; P a probability, D a duration "
    "such as 5ms or 1.5s, W and N counts";
constexpr int kMaxReorderWindow = 1 << 16;

// The shortest decimal form that reads back as exactly `v`.
std::string ExactDouble(double v) {
  for (int digits = 6;; ++digits) {
    std::string s = absl::StrFormat("%.*g", digits, v);
    if (digits >= 17 || std::strtod(s.c_str(), nullptr) == v) return s;
  }
}

// Parses one item's value; the error says what was expected (the caller names the item).
class ItemParser {
 public:
  explicit ItemParser(absl::string_view value) : value_(value) {}

  absl::StatusOr<double> Probability(bool below_one) const {
    double p = 0;
    if (!absl::SimpleAtod(value_, &p) || !(p >= 0) || p > 1 || (below_one && p >= 1)) {
      return absl::InvalidArgumentError(below_one ? "expected a probability in [0, 1) (a link that loses "
                                                    "everything is a partition)"
                                                  : "expected a probability in [0, 1]");
    }
    return p;
  }
  absl::StatusOr<absl::Duration> Duration(absl::string_view text, bool infinite_ok) const {
    absl::Duration d;
    if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration() || (!infinite_ok && d == absl::InfiniteDuration())) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a ", infinite_ok ? "" : "finite ",
                                                     "duration (e.g. 5ms, 1.5s", infinite_ok ? ", inf" : "", ")"));
    }
    return d;
  }
  absl::StatusOr<int64_t> Count(int64_t min, int64_t max) const {
    int64_t n = 0;
    if (!absl::SimpleAtoi(value_, &n) || n < min || n > max) {
      return absl::InvalidArgumentError(absl::StrCat("expected a whole number in [", min, ", ", max, "]"));
    }
    return n;
  }
  absl::StatusOr<std::pair<absl::Duration, absl::Duration>> DelayRange() const {
    // "D" or "D1-D2" (durations are never negative, so '-' only separates).
    const size_t dash = value_.find('-');
    absl::StatusOr<absl::Duration> lo = Duration(absl::StripAsciiWhitespace(value_.substr(0, dash)), false);
    if (!lo.ok()) return lo.status();
    if (dash == absl::string_view::npos) return std::make_pair(*lo, *lo);
    absl::StatusOr<absl::Duration> hi = Duration(absl::StripAsciiWhitespace(value_.substr(dash + 1)), false);
    if (!hi.ok()) return hi.status();
    if (*hi < *lo) return absl::InvalidArgumentError("the range D1-D2 needs D1 <= D2");
    return std::make_pair(*lo, *hi);
  }
  absl::StatusOr<FaultPartition> Partition() const {
    std::vector<absl::string_view> sides = absl::StrSplit(value_, '/');
    if (sides.size() != 2) return absl::InvalidArgumentError("expected two sides, names joined by '+': a+b/c+d");
    FaultPartition p;
    for (int i = 0; i < 2; ++i) {
      for (absl::string_view name : absl::StrSplit(sides[static_cast<size_t>(i)], '+')) {
        name = absl::StripAsciiWhitespace(name);
        if (name.empty()) return absl::InvalidArgumentError("a worker name is empty (expected a+b/c+d)");
        (i == 0 ? p.a : p.b).emplace_back(name);
      }
    }
    for (const std::string& name : p.a) {
      if (std::find(p.b.begin(), p.b.end(), name) != p.b.end()) {
        return absl::InvalidArgumentError(absl::StrCat("'", name, "' is on both sides"));
      }
    }
    return p;
  }
  absl::string_view value() const { return value_; }

 private:
  absl::string_view value_;
};

// Applies one name:value item to `spec`.
absl::Status ApplyItem(absl::string_view name, const ItemParser& in, FaultSpec& spec) {
  auto set = [](auto result, auto& field) -> absl::Status {
    if (!result.ok()) return result.status();
    field = *result;
    return absl::OkStatus();
  };
  if (name == "drop") return set(in.Probability(/*below_one=*/true), spec.drop);
  if (name == "duplicate") return set(in.Probability(false), spec.duplicate);
  if (name == "corrupt") return set(in.Probability(false), spec.corrupt);
  if (name == "reorder") {
    absl::StatusOr<int64_t> w = in.Count(1, kMaxReorderWindow);
    if (!w.ok()) return w.status();
    spec.reorder = static_cast<int>(*w);
    return absl::OkStatus();
  }
  if (name == "close_after") return set(in.Count(1, INT64_MAX), spec.close_after);
  if (name == "stall_after") return set(in.Count(0, INT64_MAX), spec.stall_after);
  if (name == "stall") {
    absl::StatusOr<absl::Duration> d = in.Duration(in.value(), /*infinite_ok=*/true);
    if (d.ok() && *d == absl::ZeroDuration()) return absl::InvalidArgumentError("a stall must last longer than 0");
    return set(d, spec.stall);
  }
  if (name == "rto") {
    absl::StatusOr<absl::Duration> d = in.Duration(in.value(), false);
    if (d.ok() && *d <= absl::ZeroDuration()) return absl::InvalidArgumentError("rto must be longer than 0");
    return set(d, spec.rto);
  }
  if (name == "delay") {
    absl::StatusOr<std::pair<absl::Duration, absl::Duration>> range = in.DelayRange();
    if (!range.ok()) return range.status();
    spec.delay_min = range->first;
    spec.delay_max = range->second;
    return absl::OkStatus();
  }
  if (name == "partition") {
    absl::StatusOr<FaultPartition> p = in.Partition();
    if (!p.ok()) return p.status();
    spec.partitions.push_back(*std::move(p));
    return absl::OkStatus();
  }
  if (name == "seed") {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(in.value(), &seed)) return absl::InvalidArgumentError("expected a whole number >= 0");
    spec.seed = seed;
    return absl::OkStatus();
  }
  return absl::NotFoundError("unknown fault");
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<FaultSpec> ParseFaults(absl::string_view text) {
  FaultSpec spec;
  std::vector<std::string> seen;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t colon = item.find(':');
    const absl::string_view name = absl::StripAsciiWhitespace(item.substr(0, colon));
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("bad fault '", item, "': ", why, " (", kValidForms, ")"));
    };
    if (colon == absl::string_view::npos) return bad("expected name:value");
    if (name != "partition") {
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) return bad("given twice");
      seen.emplace_back(name);
    }
    absl::Status s = ApplyItem(name, ItemParser(absl::StripAsciiWhitespace(item.substr(colon + 1))), spec);
    if (s.code() == absl::StatusCode::kNotFound) return bad(absl::StrCat("unknown fault '", name, "'"));
    if (!s.ok()) return bad(s.message());
  }
  if (spec.stall_after > 0 && spec.stall == absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad faults '", text, "': stall_after:N needs stall:D (", kValidForms, ")"));
  }
  return spec;
}

std::string FaultSpec::ToString() const {
  std::vector<std::string> items;
  if (drop > 0) items.push_back(absl::StrCat("drop:", ExactDouble(drop)));
  if (delay_max > absl::ZeroDuration()) {
    items.push_back(delay_min == delay_max ? absl::StrCat("delay:", absl::FormatDuration(delay_min))
                                           : absl::StrCat("delay:", absl::FormatDuration(delay_min), "-",
                                                          absl::FormatDuration(delay_max)));
  }
  if (duplicate > 0) items.push_back(absl::StrCat("duplicate:", ExactDouble(duplicate)));
  if (reorder > 0) items.push_back(absl::StrCat("reorder:", reorder));
  if (corrupt > 0) items.push_back(absl::StrCat("corrupt:", ExactDouble(corrupt)));
  if (stall > absl::ZeroDuration()) items.push_back(absl::StrCat("stall:", absl::FormatDuration(stall)));
  if (stall_after > 0) items.push_back(absl::StrCat("stall_after:", stall_after));
  if (close_after > 0) items.push_back(absl::StrCat("close_after:", close_after));
  for (const FaultPartition& p : partitions) {
    items.push_back(absl::StrCat("partition:", absl::StrJoin(p.a, "+"), "/", absl::StrJoin(p.b, "+")));
  }
  if (rto != absl::Milliseconds(20)) items.push_back(absl::StrCat("rto:", absl::FormatDuration(rto)));
  if (seed) items.push_back(absl::StrCat("seed:", *seed));
  return absl::StrJoin(items, ",");
}

std::string FaultStats::ToString() const {
  return absl::StrCat("sent ", frames_sent, ", delivered ", frames_delivered, ", dropped ", dropped, ", retransmitted ",
                      retransmitted, ", duplicated ", duplicated, " (", duplicates_discarded, " discarded), reordered ",
                      reordered, ", corrupted ", corrupted, " (", corruptions_detected, " detected), stalled ", stalled,
                      ", connections closed ", connections_closed);
}

FaultInjector::FaultInjector(FaultSpec spec) { Set(std::move(spec)); }

void FaultInjector::Set(FaultSpec spec) {
  {
    absl::MutexLock lock(&mu_);
    if (spec.seed) {
      seed_ = *spec.seed;
    } else if (plan_ == nullptr) {
      std::random_device rd;
      seed_ = (static_cast<uint64_t>(rd()) << 32) | rd();
    }
    connections_ = 0;
    plan_ = std::make_shared<const FaultSpec>(std::move(spec));
  }
  Notify();
}

FaultSpec FaultInjector::spec() const { return *plan(); }

std::shared_ptr<const FaultSpec> FaultInjector::plan() const {
  absl::MutexLock lock(&mu_);
  return plan_;
}

void FaultInjector::Partition(std::vector<std::string> a, std::vector<std::string> b) {
  {
    absl::MutexLock lock(&mu_);
    auto next = std::make_shared<FaultSpec>(*plan_);
    next->partitions.push_back(FaultPartition{std::move(a), std::move(b)});
    plan_ = std::move(next);
  }
  Notify();
}

void FaultInjector::Heal() {
  {
    absl::MutexLock lock(&mu_);
    auto next = std::make_shared<FaultSpec>(*plan_);
    next->partitions.clear();
    plan_ = std::move(next);
  }
  Notify();
}

void FaultInjector::Stall(absl::Duration duration) {
  {
    absl::MutexLock lock(&mu_);
    stalled_until_ = duration == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + duration;
  }
  Notify();
}

void FaultInjector::Unstall() {
  {
    absl::MutexLock lock(&mu_);
    stalled_until_ = absl::InfinitePast();
    ++unstalls_;
  }
  Notify();
}

bool FaultInjector::Partitioned(const std::string& x, const std::string& y) const {
  if (x.empty() || y.empty()) return false;
  auto in = [](const std::vector<std::string>& side, const std::string& name) {
    return std::find(side.begin(), side.end(), name) != side.end();
  };
  absl::MutexLock lock(&mu_);
  for (const FaultPartition& p : plan_->partitions) {
    if ((in(p.a, x) && in(p.b, y)) || (in(p.a, y) && in(p.b, x))) return true;
  }
  return false;
}

absl::Time FaultInjector::stalled_until() const {
  absl::MutexLock lock(&mu_);
  return stalled_until_;
}

uint64_t FaultInjector::unstalls() const {
  absl::MutexLock lock(&mu_);
  return unstalls_;
}

uint64_t FaultInjector::NextSeed() {
  absl::MutexLock lock(&mu_);
  return SplitMix64(seed_ ^ SplitMix64(++connections_));
}

void FaultInjector::Count(uint64_t FaultStats::*counter, uint64_t n) {
  absl::MutexLock lock(&mu_);
  stats_.*counter += n;
}

FaultStats FaultInjector::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool FaultInjector::AwaitStats(const std::function<bool(const FaultStats&)>& until, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return until(stats_); };
  return mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
}

uint64_t FaultInjector::AddObserver(std::function<void()> changed) {
  absl::MutexLock lock(&observers_mu_);
  const uint64_t id = next_observer_++;
  observers_.emplace(id, std::move(changed));
  return id;
}

void FaultInjector::RemoveObserver(uint64_t id) {
  absl::MutexLock lock(&observers_mu_);
  observers_.erase(id);
}

void FaultInjector::Notify() {
  absl::MutexLock lock(&observers_mu_);
  for (auto& [id, changed] : observers_) changed();
}

}  // namespace gw::rpc
