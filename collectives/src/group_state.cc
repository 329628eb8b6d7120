#include "group_state.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/statistics.h"
#include "gradwire/rpc/trace.h"

namespace gw::collectives {
namespace {

const char* KindName(int64_t kind) {
  switch (static_cast<internal::Kind>(kind)) {
    case internal::Kind::kAllReduce: return "allreduce";
    case internal::Kind::kBroadcast: return "broadcast";
    case internal::Kind::kAllGather: return "allgather";
    case internal::Kind::kReduceScatter: return "reduce_scatter";
    case internal::Kind::kAllToAll: return "all_to_all";
    case internal::Kind::kBarrier: return "barrier";
  }
  return "unknown collective";
}

}  // namespace

// ------------------------------------------------------------------------------ Op

int Op::rank() const { return group_.rank(); }
int Op::size() const { return group_.size(); }
const GroupOptions& Op::options() const { return group_.options(); }

void Op::Send(int to, int64_t step, Tensor data) {
  GroupState& g = group_;
  {
    absl::MutexLock lock(&g.mu_);
    ++g.unanswered_;
  }
  internal::CollectiveChunk chunk{g.id(), seq_, step, signature_, std::move(data)};
  const rpc::WorkerInfo& peer = g.config_.agent->workers()[static_cast<size_t>(g.config_.ranks[static_cast<size_t>(to)])];
  rpc::CallOptions options;
  // Past the collective's own deadline, whose error says more (what it waited for).
  options.timeout = std::max(deadline_ - absl::Now(), absl::ZeroDuration()) + absl::Seconds(1);
  std::weak_ptr<GroupState> weak = g.weak_from_this();
  const int64_t seq = seq_;
  g.config_.agent->Send(peer.name, std::move(chunk), options, [weak, seq, to, name = peer.name](absl::StatusOr<rpc::Ack> r) {
    std::shared_ptr<GroupState> self = weak.lock();
    if (!self) return;
    if (!r.ok() && !rpc::NamesWorker(r.status().message(), name)) {
      // A transport's own error ("send to 127.0.0.1:port failed: Broken pipe") names no worker.
      r = absl::Status(r.status().code(), absl::StrCat("sending to ", name, " failed: ", r.status().message()));
    }
    absl::MutexLock lock(&self->mu_);
    --self->unanswered_;
    // A member that told us it completed this collective took the piece: its answer was
    // lost with its connection (it closed its group and left).
    if (!r.ok() && seq < self->completed_below_[static_cast<size_t>(to)]) r = rpc::Ack{};
    if (!r.ok()) {
      if (r.status().code() == absl::StatusCode::kUnavailable) self->BreakLocked(r.status(), /*from_peer=*/false, 0);
      if (seq > self->retired_) self->FailLocked(seq, r.status(), /*from_peer=*/false);
    }
    self->Wake();
  });
}

absl::StatusOr<Tensor> Op::Recv(int from, int64_t step, int64_t numel) {
  GroupState& g = group_;
  const GroupState::Key key{seq_, step, from};
  std::optional<Promise<rpc::Ack>> taken;  // the held answer of the piece, moved out of the inbox
  Tensor data;
  {
    absl::MutexLock lock(&g.mu_);
    for (;;) {
      if (std::optional<GroupState::Failure> e = g.ErrorLocked(seq_)) {
        g.waiting_for_ = -1;
        return e->status;
      }
      auto it = g.inbox_.find(key);
      if (it != g.inbox_.end()) {
        g.waiting_for_ = -1;
        data = std::move(it->second.data);
        taken = std::move(it->second.taken);
        g.inbox_.erase(it);
        break;
      }
      g.waiting_for_ = from;
      if (g.SpinLocked(deadline_)) continue;
      if (absl::Now() >= deadline_) {
        g.waiting_for_ = -1;
        absl::Status s = absl::DeadlineExceededError(
            absl::StrCat(g.Describe(signature_, seq_), ": nothing from ", g.Member(from), " within ",
                         absl::FormatDuration(g.config_.timeout), " (did it issue this collective, or is it frozen?); ",
                         "the group is broken"));
        g.BreakLocked(s, /*from_peer=*/false, 0);
        return s;
      }
      g.WaitLocked(deadline_);
    }
  }
  const DType dtype = static_cast<DType>(signature_.dtype);
  if (data.dtype() != dtype || (numel >= 0 && data.numel() != numel) || !data.is_contiguous()) {
    absl::Status s = absl::InvalidArgumentError(
        absl::StrCat(g.Describe(signature_, seq_), ": ", g.Member(from), " sent a malformed piece ", step, ": ",
                     DTypeName(data.dtype()), " with ", data.numel(), " elements, expected ", DTypeName(dtype),
                     " with ", numel));
    taken->Set(s);
    absl::MutexLock lock(&g.mu_);
    g.FailLocked(seq_, s, /*from_peer=*/false);
    return s;
  }
  taken->Set(rpc::Ack{});  // the sender's piece was used
  return data;
}

absl::Status Op::Finish() {
  GroupState& g = group_;
  absl::MutexLock lock(&g.mu_);
  for (;;) {
    if (std::optional<GroupState::Failure> e = g.ErrorLocked(seq_)) return e->status;
    if (g.unanswered_ == 0) return absl::OkStatus();
    if (g.SpinLocked(deadline_)) continue;
    if (absl::Now() >= deadline_) {
      absl::Status s = absl::DeadlineExceededError(absl::StrCat(
          g.Describe(signature_, seq_), ": ", g.unanswered_, " piece(s) sent were not taken within ",
          absl::FormatDuration(g.config_.timeout), "; the group is broken"));
      g.BreakLocked(s, /*from_peer=*/false, 0);
      return s;
    }
    g.WaitLocked(deadline_);
  }
}

// ---------------------------------------------------------------------- GroupState

GroupState::GroupState(Config config)
    : config_(std::move(config)), completed_below_(config_.ranks.size(), 0), heard_(config_.ranks.size(), false) {}

GroupState::~GroupState() {
  Close();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // the thread held the last reference: it is returning
    } else {
      thread_.join();
    }
  }
}

void GroupState::Start() {
  statistics_ =
      config_.agent->statistics().Add("collectives", [this](std::vector<rpc::Sample>& out) { AppendStatistics(out); });
  waits_ = config_.agent->waits().Add("collectives", [this](std::vector<rpc::Wait>& out) { AppendWaits(out); });
  // The thread keeps the state alive until it returns (after Close).
  thread_ = std::thread([self = shared_from_this()] { self->Run(); });
}

void GroupState::AppendStatistics(std::vector<rpc::Sample>& out) const {
  const std::map<std::string, std::string> labels = {
      {"group", config_.options.name.empty() ? absl::StrCat("[", absl::StrJoin(config_.ranks, ", "), "]")
                                             : config_.options.name}};
  auto add = [&](const char* name, double value) {
    out.push_back({absl::StrCat("gradwire_collectives_", name), labels, value});
  };
  absl::MutexLock lock(&mu_);
  add("issued_total", static_cast<double>(next_seq_));
  add("completed_total", static_cast<double>(retired_ + 1));
  add("failed_total", static_cast<double>(failures_));
  add("queued", static_cast<double>(queue_.size()));
  // The running collective's number (-1: none) and how long it has run: a collective that
  // waits for a member shows here on every member that issued it.
  add("running", static_cast<double>(running_));
  add("running_seconds", running_ >= 0 ? absl::ToDoubleSeconds(absl::Now() - running_since_) : 0.0);
}

void GroupState::AppendWaits(std::vector<rpc::Wait>& out) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (running_ >= 0) {
    rpc::Wait w{.layer = "collectives",
                .state = "waits",
                .what = Describe(running_signature_, running_),
                .seconds = absl::ToDoubleSeconds(now - running_since_)};
    for (size_t m = 0; m < heard_.size(); ++m) {
      if (heard_[m] || static_cast<int>(m) == config_.rank) w.ready.push_back(config_.ranks[m]);
    }
    if (waiting_for_ >= 0) {
      w.on.push_back(config_.ranks[static_cast<size_t>(waiting_for_)]);
      w.note = absl::StrCat("waits for a piece from ", Member(waiting_for_));
    } else {
      w.note = "sending or reducing";
    }
    out.push_back(std::move(w));
  }
  if (retired_ >= 0) {
    out.push_back({.layer = "collectives",
                   .state = "last",
                   .what = Describe(last_signature_, retired_),
                   .seconds = absl::ToDoubleSeconds(now - last_done_at_),
                   .note = absl::StrCat(next_seq_, " issued, ", queue_.size(), " queued")});
  } else if (running_ < 0) {
    out.push_back({.layer = "collectives",
                   .state = "last",
                   .what = absl::StrCat("no collective of ", Label(), " yet"),
                   .seconds = -1,
                   .note = absl::StrCat(next_seq_, " issued, ", queue_.size(), " queued")});
  }
}

int GroupState::GroupRankOf(int agent_rank) const {
  auto it = std::lower_bound(config_.ranks.begin(), config_.ranks.end(), agent_rank);
  if (it == config_.ranks.end() || *it != agent_rank) return -1;
  return static_cast<int>(it - config_.ranks.begin());
}

std::string GroupState::Label() const {
  if (!config_.options.name.empty()) return absl::StrCat("group '", config_.options.name, "'");
  return absl::StrCat("group [", absl::StrJoin(config_.ranks, ", "), "]");
}

std::string GroupState::Describe(const internal::Signature& s, int64_t seq) const {
  return absl::StrCat(KindName(s.kind), " #", seq, " of ", Label());
}

std::string GroupState::Member(int group_rank) const {
  const int agent_rank = config_.ranks[static_cast<size_t>(group_rank)];
  return absl::StrCat("rank ", group_rank, " (", config_.agent->workers()[static_cast<size_t>(agent_rank)].name, ")");
}

std::string GroupState::DescribeIssue(const internal::Signature& s) const {
  std::string what = KindName(s.kind);
  const auto kind = static_cast<internal::Kind>(s.kind);
  if (kind == internal::Kind::kAllReduce || kind == internal::Kind::kReduceScatter) {
    absl::StrAppend(&what, "(", ReduceOpName(static_cast<ReduceOp>(s.op)), ")");
  } else if (kind == internal::Kind::kBroadcast) {
    absl::StrAppend(&what, "(root ", s.op, ")");
  }
  absl::StrAppend(&what, " of ", DTypeName(static_cast<DType>(s.dtype)), " [", absl::StrJoin(s.shape, ", "), "]");
  if (s.algorithm == 1) absl::StrAppend(&what, " (ring)");
  if (s.algorithm > 1) absl::StrAppend(&what, " (ring, ", s.algorithm, "-byte pieces)");
  return what;
}

void GroupState::Enqueue(Job job) {
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) {
      queue_.push_back(Queued{next_seq_++, std::move(job)});
      Wake();
      return;
    }
  }
  job.complete(rpc::ShuttingDownError(config_.agent->self().name, absl::StrCat(Label(), " is closed")));
}

void GroupState::Close() {
  std::deque<Queued> dropped;
  std::vector<Promise<rpc::Ack>> answers;
  bool tell = false;
  int64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    tell = !broken_told_;
    broken_told_ = true;
    seq = retired_ + 1;
    dropped.swap(queue_);
    for (auto& [key, arrival] : inbox_) answers.push_back(std::move(arrival.taken));
    inbox_.clear();
    Wake();
  }
  const std::string& self = config_.agent->self().name;
  const absl::Status gone = rpc::UnavailableError(self, absl::StrCat("it closed ", Label()));
  if (tell) BroadcastAbort(seq, gone, /*broken=*/true);  // the others fail at once, not at their deadline
  for (Promise<rpc::Ack>& a : answers) a.Set(gone);
  for (Queued& q : dropped) q.job.complete(rpc::ShuttingDownError(self, absl::StrCat(Label(), " was closed")));
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

Future<rpc::Ack> GroupState::Deliver(int from_agent_rank, internal::CollectiveChunk chunk) {
  const int sender = GroupRankOf(from_agent_rank);
  if (sender < 0 || sender == config_.rank) {
    return MakeReadyFuture<rpc::Ack>(executor(), absl::InvalidArgumentError(absl::StrCat(
        "worker of rank ", from_agent_rank, " is not a member of ", Label(), " on ", config_.agent->self().name)));
  }
  absl::MutexLock lock(&mu_);
  if (chunk.seq <= retired_) {  // a late piece: of a collective that completed here, or failed
    auto failed = recently_failed_.find(chunk.seq);
    if (failed != recently_failed_.end()) return MakeReadyFuture<rpc::Ack>(executor(), failed->second);
    return MakeReadyFuture<rpc::Ack>(executor(), rpc::Ack{});
  }
  if (closed_) {
    return MakeReadyFuture<rpc::Ack>(
        executor(), rpc::UnavailableError(config_.agent->self().name, absl::StrCat("it closed ", Label())));
  }
  if (inbox_.size() >= kMaxInbox) {
    return MakeReadyFuture<rpc::Ack>(executor(), absl::ResourceExhaustedError(absl::StrCat(
        config_.agent->self().name, " holds ", inbox_.size(), " pieces not yet used for ", Label(),
        ": is a member issuing collectives that it does not?")));
  }
  const Key key{chunk.seq, chunk.step, sender};
  if (inbox_.contains(key)) {
    return MakeReadyFuture<rpc::Ack>(executor(), absl::InvalidArgumentError(absl::StrCat(
        Member(sender), " sent piece ", chunk.step, " of collective #", chunk.seq, " of ", Label(), " twice")));
  }
  if (chunk.seq == running_) {
    CheckSignatureLocked(sender, chunk.signature);
    heard_[static_cast<size_t>(sender)] = true;
  }
  Promise<rpc::Ack> taken(executor());
  Future<rpc::Ack> answer = taken.future();
  inbox_.emplace(key, Arrival{std::move(chunk.signature), std::move(chunk.data), std::move(taken)});
  Wake();
  return answer;
}

void GroupState::Abort(int from_agent_rank, const internal::CollectiveAbort& abort) {
  const int sender = GroupRankOf(from_agent_rank);
  if (sender < 0 || sender == config_.rank) return;
  auto code = static_cast<absl::StatusCode>(abort.code);
  if (code == absl::StatusCode::kOk || abort.code < 0 || abort.code > 16) code = absl::StatusCode::kUnknown;
  absl::Status status(code, abort.message);
  absl::MutexLock lock(&mu_);
  if (abort.broken) {
    // The member broke the group from collective abort.seq on: the ones before it are
    // complete there (a member that closes its group right after a collective may tell
    // us before its answers to our last pieces reach us), and complete here as well.
    const int64_t since = std::max<int64_t>(abort.seq, 0);
    int64_t& completed = completed_below_[static_cast<size_t>(sender)];
    completed = std::max(completed, since);
    BreakLocked(status, /*from_peer=*/true, since);
  } else if (abort.seq > retired_) {
    FailLocked(abort.seq, status, /*from_peer=*/true);
  }
  Wake();
}

void GroupState::OnPeerGone(int agent_rank) {
  const int member = GroupRankOf(agent_rank);
  if (member < 0 || member == config_.rank) return;
  absl::MutexLock lock(&mu_);
  // A member that closed its group after collective k and then left (or exited) breaks
  // it from k + 1 only: what it completed completes here too.
  BreakLocked(rpc::UnavailableError(config_.agent->workers()[static_cast<size_t>(agent_rank)].name,
                                    absl::StrCat("it died (its connections closed), ", Member(member), " of ", Label(),
                                                 ", which is broken")),
              /*from_peer=*/false, completed_below_[static_cast<size_t>(member)]);
  Wake();
}

bool GroupState::BreakLocked(absl::Status status, bool from_peer, int64_t since) {
  if (broken_ && broken_since_ <= since) return false;
  broken_ = std::move(status);
  broken_from_peer_ = from_peer;
  broken_since_ = since;
  broken_told_ = from_peer;  // the others know of this break point only if they told us
  Wake();
  return true;
}

bool GroupState::BrokenAtLocked(int64_t seq) const { return broken_ && seq >= broken_since_; }

void GroupState::FailLocked(int64_t seq, absl::Status status, bool from_peer) {
  failed_.try_emplace(seq, Failure{std::move(status), from_peer});
  Wake();
}

void GroupState::CheckSignatureLocked(int sender, const internal::Signature& theirs) {
  if (theirs == running_signature_) return;
  FailLocked(running_,
             absl::InvalidArgumentError(absl::StrCat(Describe(running_signature_, running_), ": members disagree: ",
                                                     Member(config_.rank), " issued ", DescribeIssue(running_signature_),
                                                     ", ", Member(sender), " issued ", DescribeIssue(theirs))),
             /*from_peer=*/false);
}

std::optional<GroupState::Failure> GroupState::ErrorLocked(int64_t seq) const {
  if (closed_) {
    return Failure{rpc::ShuttingDownError(config_.agent->self().name, absl::StrCat(Label(), " was closed")), false};
  }
  if (auto it = failed_.find(seq); it != failed_.end()) return it->second;
  if (BrokenAtLocked(seq)) return Failure{*broken_, broken_from_peer_ || broken_told_};
  return std::nullopt;
}

void GroupState::RetireLocked(int64_t seq, std::vector<Promise<rpc::Ack>>* answers) {
  for (auto it = inbox_.begin(); it != inbox_.end();) {
    if (std::get<0>(it->first) <= seq) {
      answers->push_back(std::move(it->second.taken));
      inbox_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto it = failed_.begin(); it != failed_.end();) {
    if (it->first <= seq) {
      failed_.erase(it++);
    } else {
      ++it;
    }
  }
  if (seq == running_) {
    last_signature_ = running_signature_;
    last_done_at_ = absl::Now();
  }
  retired_ = seq;
  running_ = -1;
}

void GroupState::BroadcastAbort(int64_t seq, const absl::Status& status, bool broken) {
  rpc::CallOptions options;
  options.timeout = absl::Seconds(5);
  for (int member = 0; member < size(); ++member) {
    if (member == config_.rank) continue;
    const std::string& to = config_.agent->workers()[static_cast<size_t>(config_.ranks[static_cast<size_t>(member)])].name;
    internal::CollectiveAbort abort{id(), seq, static_cast<int64_t>(status.code()), std::string(status.message()), broken};
    config_.agent->Send(to, std::move(abort), options, [](const absl::StatusOr<rpc::Ack>&) {});  // best effort
  }
}

void GroupState::Wake() { events_.fetch_add(1, std::memory_order_release); }

void GroupState::WaitLocked(absl::Time deadline) {
  // A condition on the mutex (not a CondVar): absl re-evaluates it whenever the lock is
  // released, and ThreadSanitizer builds see its happens-before edges.
  struct Since {
    GroupState* group;
    uint64_t seen;
  } since{this, events_.load(std::memory_order_acquire)};
  mu_.AwaitWithDeadline(
      absl::Condition(+[](Since* s) { return s->group->events_.load(std::memory_order_acquire) != s->seen; }, &since),
      deadline);
}

bool GroupState::SpinLocked(absl::Time deadline) {
  const absl::Duration spin = config_.options.spin;
  if (spin <= absl::ZeroDuration()) return false;
  const uint64_t seen = events_.load(std::memory_order_acquire);
  const absl::Time until = std::min(deadline, absl::Now() + spin);
  mu_.Unlock();
  while (events_.load(std::memory_order_acquire) == seen && absl::Now() < until) {
  }
  mu_.Lock();
  // Wake runs under the lock: whatever changed before we took it again is seen here.
  return events_.load(std::memory_order_acquire) != seen;
}

void GroupState::BeginLocked(const Queued& q) {
  running_ = q.seq;
  running_since_ = absl::Now();
  running_signature_ = q.job.signature;
  std::fill(heard_.begin(), heard_.end(), false);
  for (const auto& [key, arrival] : inbox_) {
    if (std::get<0>(key) != q.seq) continue;
    CheckSignatureLocked(std::get<2>(key), arrival.signature);
    heard_[static_cast<size_t>(std::get<2>(key))] = true;
  }
}

void GroupState::Run() {
  for (;;) {
    Queued q;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](GroupState* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu_) {
            return g->closed_ || (!g->queue_.empty() && g->running_ < 0);
          },
          this));
      if (closed_) return;
      q = std::move(queue_.front());
      queue_.pop_front();
      BeginLocked(q);
    }
    Execute(q);
  }
}

void GroupState::Execute(Queued& q) {
  rpc::Tracer& tracer = config_.agent->tracer();
  rpc::Tracer::Scope span(tracer, tracer.Intern("collectives"), tracer.Intern(KindName(q.job.signature.kind)));
  span.span().arg_names[0] = tracer.Intern("seq");
  span.span().arg_values[0] = q.seq;
  int64_t numel = 1;
  for (int64_t d : q.job.signature.shape) numel *= d;
  span.span().arg_names[1] = tracer.Intern("elements");
  span.span().arg_values[1] = numel;
  span.span().note = tracer.Intern(Label());
  const absl::Time deadline = absl::Now() + config_.timeout;
  Op op(*this, q.seq, q.job.signature, deadline);
  absl::Status s = q.job.invalid;
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    // Flow control: pieces of earlier collectives still unanswered hold this one back.
    while (unanswered_ > kMaxUnanswered && !ErrorLocked(q.seq) && absl::Now() < deadline) {
      WaitLocked(deadline);
    }
    if (std::optional<Failure> e = ErrorLocked(q.seq)) s = e->status;
  }
  if (s.ok()) s = rpc::CatchExceptions(KindName(q.job.signature.kind), [&] { return q.job.run(op); });
  bool tell = false;
  bool broken = false;
  bool closing = false;
  absl::Status told = s;
  std::vector<Promise<rpc::Ack>> answers;
  {
    absl::MutexLock lock(&mu_);
    // Closed while the collective finished here: the others were told the group broke
    // from this collective on, so it fails here as well.
    if (s.ok() && closed_) s = rpc::ShuttingDownError(config_.agent->self().name, absl::StrCat(Label(), " was closed"));
    if (!s.ok()) {
      ++failures_;
      std::optional<Failure> e = ErrorLocked(q.seq);
      tell = !(e && e->from_peer);
      broken = BrokenAtLocked(q.seq);
      closing = closed_;
      if (closing) told = rpc::UnavailableError(config_.agent->self().name, absl::StrCat("it closed ", Label()));
      if (broken || closing) broken_told_ = true;
      // Pieces of this collective that arrive later are answered with its error, so their
      // senders fail it too even if they were done.
      recently_failed_[q.seq] = told;
      if (recently_failed_.size() > kRecentFailures) recently_failed_.erase(recently_failed_.begin());
    }
    RetireLocked(q.seq, &answers);
  }
  if (tell) BroadcastAbort(q.seq, told, broken || closing);
  for (Promise<rpc::Ack>& a : answers) a.Set(s.ok() ? absl::StatusOr<rpc::Ack>(rpc::Ack{}) : told);
  if (!s.ok()) {
    // The transport may still be reading the caller's memory: give the pieces sent a
    // moment to be answered (or to fail) before the caller gets its tensors back.
    absl::MutexLock lock(&mu_);
    const absl::Time until = std::min(deadline, absl::Now() + absl::Seconds(1));
    while (unanswered_ > 0 && absl::Now() < until) WaitLocked(until);
  }
  q.job.complete(s);
}

}  // namespace gw::collectives
