#include "cluster/rendezvous.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "transport/host_address.h"

namespace gw::rpc::internal {
namespace {

// How long MayBeListening waits for a TCP connection (to tell a store that does not
// answer from an address where nothing listens, once a joiner gave up).
constexpr int kProbeMs = 2000;
// Ranks and names listed in a progress line, at most.
constexpr size_t kListed = 8;
// A wait for the store says so ever less often: its interval doubles up to this.
constexpr absl::Duration kMaxProgressInterval = absl::Seconds(60);

// Runs tick() from its own thread after `first`, then after twice as long each time (at
// most kMaxProgressInterval, or `first` if that is longer), until destroyed.
class Reporter {
 public:
  Reporter(absl::Duration first, std::function<void()> tick)
      : thread_([this, first, tick = std::move(tick)] {
          const absl::Duration longest = std::max(first, kMaxProgressInterval);
          absl::Duration every = std::max(first, absl::Milliseconds(1));
          for (; !done_.WaitForNotificationWithTimeout(every); every = std::min(2 * every, longest)) {
            tick();
          }
        }) {}
  ~Reporter() {
    done_.Notify();
    thread_.join();
  }
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

 private:
  absl::Notification done_;  // before thread_, which uses it
  std::thread thread_;
};

// Whether something listens at `address` (host:port): false only when every address it
// resolves to refused the connection (nothing listens there); true when one accepted,
// or when the answer is not known (no route yet, a firewall dropping packets, ...).
bool MayBeListening(const std::string& address) {
  absl::StatusOr<HostPort> hp = SplitHostPort(address);
  if (!hp.ok()) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(hp->host.c_str(), absl::StrCat(hp->port).c_str(), &hints, &found) != 0) return true;
  bool refused_everywhere = found != nullptr;
  for (addrinfo* ai = found; ai != nullptr && refused_everywhere; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      refused_everywhere = false;
      break;
    }
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        err = ETIMEDOUT;
        if (::poll(&p, 1, kProbeMs) == 1) {
          socklen_t len = sizeof err;
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
    }
    ::close(fd);
    if (err != ECONNREFUSED) refused_everywhere = false;
  }
  ::freeaddrinfo(found);
  return !refused_everywhere;
}

template <typename T>
std::string Listed(const std::vector<T>& items) {
  std::vector<T> shown(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(std::min(items.size(), kListed)));
  std::string text = absl::StrJoin(shown, ", ");
  if (items.size() > kListed) absl::StrAppend(&text, ", ... (", items.size(), " in all)");
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Join(const AgentOptions& options, absl::Time deadline,
                                                             RendezvousProgress progress) {
  std::unique_ptr<Rendezvous> r(new Rendezvous(options, std::move(progress)));
  r->store_address_ = options.rendezvous;
  if (!IsEtcdUrl(options.rendezvous) && options.rank == 0 && options.host_store && !options.join) {
    const size_t colon = options.rendezvous.rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(options.rendezvous.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(absl::StrCat("bad rendezvous address '", options.rendezvous,
                                                     "' (expected host:port, e.g. MASTER_ADDR:MASTER_PORT)"));
    }
    auto server = StoreServer::Start(options.rendezvous.substr(0, colon), port, options.security);
    if (!server.ok()) return server.status();
    r->server_ = std::move(*server);
    if (port == 0) r->store_address_ = r->server_->address();
  }
  if (absl::Status s = r->Connect(deadline); !s.ok()) return s;
  return r;
}

// Connects to the store in one attempt until it gives up (gRPC redials a refused or
// dropped connection meanwhile), so that authenticating or probing etcd, which may start
// late in the wait, has all the time that is left; a Reporter says meanwhile that it
// waits, ever less often. A worker that joins waits only progress_.join_store_wait.
absl::Status Rendezvous::Connect(absl::Time deadline) {
  const bool etcd = IsEtcdUrl(store_address_);
  const absl::Time start = absl::Now();
  const bool joining = options_.join && !etcd;
  const absl::Time give_up = joining ? std::min(deadline, start + progress_.join_store_wait) : deadline;
  absl::Status status;
  {
    Reporter reporter(progress_.every, [&] {
      Say(absl::StrCat(Who(), ": waiting for the rendezvous store at ", store_address_,
                       etcd ? "" : " (served by rank 0: is it running?)", " to answer", Waited(start, give_up)));
    });
    // Again while the store is unavailable (e.g. it dropped the connection during the
    // handshake: it is starting or restarting), a little later each time.
    for (absl::Duration pause = absl::Milliseconds(50);; pause = std::min(2 * pause, absl::Seconds(1))) {
      if (etcd) {
        absl::StatusOr<std::unique_ptr<EtcdStore>> connected =
            ConnectEtcdStore(store_address_, give_up, options_.security.tls);
        if (connected.ok()) {
          etcd_ = connected->get();
          store_ = *std::move(connected);
        }
        status = connected.status();
      } else {
        absl::StatusOr<std::unique_ptr<Store>> connected = ConnectStore(store_address_, give_up, options_.security);
        if (connected.ok()) store_ = *std::move(connected);
        status = connected.status();
      }
      if (!absl::IsUnavailable(status) || absl::Now() + pause >= give_up) break;
      absl::SleepFor(pause);
    }
  }
  if (status.ok() || !joining) return status;
  // A store that refused our secret says so; one that never connected or never answered
  // (its authentication cut off by the wait) means there is no job to join.
  if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status)) return status;
  const std::string no_job = absl::StrCat(
      "the job may have finished, or MASTER_ADDR and MASTER_PORT (--master-addr, --master-port) do not name a "
      "running job started with room to grow (max_world_size: gradwire launch --max-workers)");
  if (!MayBeListening(store_address_)) {
    return absl::UnavailableError(absl::StrCat(Who(), ": cannot join a job at ", store_address_,
                                               ": nothing listens there for its rendezvous store (connection refused "
                                               "for ",
                                               absl::FormatDuration(give_up - start), "); ", no_job));
  }
  return absl::UnavailableError(
      absl::StrCat(Who(), ": cannot join a job at ", store_address_, ": its rendezvous store did not answer within ",
                   absl::FormatDuration(give_up - start), " (", status.message(), "); ", no_job));
}

std::string Rendezvous::Who() const {
  if (!options_.name.empty()) return options_.name;
  return options_.join ? std::string("a worker joining") : absl::StrCat("rank ", options_.rank);
}

void Rendezvous::Say(const std::string& line) const {
  if (progress_.say) {
    progress_.say(line);
  } else {
    std::fprintf(stderr, "gradwire: %s\n", line.c_str());
  }
}

std::string Rendezvous::Waited(absl::Time since, absl::Time deadline) const {
  auto seconds = [](absl::Duration d) {
    d = absl::Seconds(absl::ToInt64Seconds(std::max(d, absl::ZeroDuration()) + absl::Milliseconds(500)));
    return d == absl::ZeroDuration() ? std::string("0s") : absl::FormatDuration(d);
  };
  const absl::Time now = absl::Now();
  return absl::StrCat(" (waiting ", seconds(now - since), " so far; giving up in ", seconds(deadline - now), ")");
}

Rendezvous::~Rendezvous() { Close(); }

std::string Rendezvous::Key(absl::string_view what, int rank) const {
  return absl::StrCat(options_.run_id, "/", what, rank);
}

absl::Status Rendezvous::Announce(const WorkerInfo& self) {
  return store_->Set(Key("worker/", self.rank),
                     absl::StrCat(self.name, "\n", self.address, "\n", self.pid, "\n", self.gpus));
}

absl::StatusOr<WorkerInfo> Rendezvous::Parse(int rank, const std::string& record) const {
  std::vector<std::string> parts = absl::StrSplit(record, '\n');
  WorkerInfo w;
  // Three lines from a worker of an older gradwire (its hello then names its version).
  if (parts.size() < 3 || parts.size() > 4 || !absl::SimpleAtoi(parts[2], &w.pid) ||
      (parts.size() == 4 && (!absl::SimpleAtoi(parts[3], &w.gpus) || w.gpus < 0))) {
    return absl::DataLossError(absl::StrCat("bad worker record for rank ", rank, " in the rendezvous store"));
  }
  w.name = parts[0];
  w.rank = rank;
  w.address = parts[1];
  return w;
}

// Every rank waits for the others' records with one Wait per interval. One of them
// speaks for the group: the first to wait (an atomic counter in the store, added to once
// per process), which reads every rank's record to say who is missing; the others do no
// more than their Wait. At the deadline each lists the missing ranks in its error, once.
absl::StatusOr<std::vector<WorkerInfo>> Rendezvous::AwaitAll(absl::Time deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < options_.world_size; ++r) keys.push_back(Key("worker/", r));
  // Who is missing, and the names of who joined.
  auto census = [&](std::vector<int>* missing, std::vector<std::string>* present) {
    for (int r = 0; r < options_.world_size; ++r) {
      absl::StatusOr<std::string> record = store_->Get(keys[static_cast<size_t>(r)], absl::Milliseconds(1));
      if (!record.ok()) {
        missing->push_back(r);
      } else if (absl::StatusOr<WorkerInfo> w = Parse(r, *record); w.ok() && present != nullptr) {
        present->push_back(w->name);
      }
    }
  };
  const absl::Time start = absl::Now();
  std::optional<bool> speaks;  // known after the first interval
  for (;;) {
    const absl::Time slice = std::min(deadline, absl::Now() + progress_.every);
    absl::Status s = store_->Wait(keys, slice - absl::Now());
    if (s.ok()) break;
    if (!absl::IsDeadlineExceeded(s) || absl::Now() >= deadline) {
      std::vector<int> missing;
      census(&missing, nullptr);
      return absl::DeadlineExceededError(absl::StrCat(
          "not every worker joined within ", absl::FormatDuration(options_.start_timeout), ": rank(s) ",
          missing.empty() ? "?" : absl::StrJoin(missing, ", "), " of ", options_.world_size,
          " did not announce themselves (", s.message(), "); check WORLD_SIZE and that every rank was started"));
    }
    if (!speaks.has_value()) {
      absl::StatusOr<int64_t> waiting = store_->Add(absl::StrCat(options_.run_id, "/progress_speaker"), 1);
      speaks = waiting.ok() && *waiting == 1;
    }
    if (!*speaks) continue;
    std::vector<int> missing;
    std::vector<std::string> present;  // names
    census(&missing, &present);
    if (missing.empty()) continue;  // the last one arrived meanwhile
    Say(absl::StrCat(Who(), ": waiting for rank", missing.size() == 1 ? " " : "s ", Listed(missing), " of ",
                     options_.world_size, " to join at the rendezvous store ", store_address_, " (",
                     options_.world_size - static_cast<int>(missing.size()), " joined: ", Listed(present),
                     "); have they been started, with the same WORLD_SIZE and rendezvous address?",
                     Waited(start, deadline)));
  }
  std::vector<WorkerInfo> workers;
  absl::flat_hash_map<std::string, int> by_name;
  for (int r = 0; r < options_.world_size; ++r) {
    auto record = store_->Get(keys[static_cast<size_t>(r)], deadline - absl::Now());
    if (!record.ok()) return record.status();
    absl::StatusOr<WorkerInfo> w = Parse(r, *record);
    if (!w.ok()) return w.status();
    if (auto [it, fresh] = by_name.emplace(w->name, r); !fresh) {
      return absl::InvalidArgumentError(absl::StrCat("worker name '", w->name, "' is used by ranks ", it->second,
                                                     " and ", r, "; names must be unique"));
    }
    workers.push_back(*std::move(w));
  }
  return workers;
}

std::shared_ptr<Store> Rendezvous::Current() const {
  absl::MutexLock lock(&mu_);
  return store_;
}

absl::StatusOr<WorkerInfo> Rendezvous::Lookup(int rank, absl::Duration timeout) {
  std::shared_ptr<Store> store = Current();
  if (store == nullptr) return absl::UnavailableError("the rendezvous store is closed (this agent is shutting down)");
  auto record = store->Get(Key("worker/", rank), timeout);
  if (!record.ok()) return record.status();
  return Parse(rank, *record);
}

absl::Status Rendezvous::PublishGroup(int world_size, int capacity) {
  return store_->Set(absl::StrCat(options_.run_id, "/group"), absl::StrCat(world_size, " ", capacity));
}

absl::StatusOr<std::pair<int, int>> Rendezvous::ReadGroup(absl::Time deadline) {
  const std::string key = absl::StrCat(options_.run_id, "/group");
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v;
  for (;;) {
    const absl::Time slice = std::min(deadline, absl::Now() + progress_.every);
    v = store_->Get(key, slice - absl::Now());
    if (v.ok()) break;
    if (!absl::IsDeadlineExceeded(v.status()) || absl::Now() >= deadline) {
      return absl::Status(v.status().code(),
                          absl::StrCat("no running group '", options_.run_id, "' to join at ", store_address_, ": ",
                                       v.status().message(),
                                       " (its rank 0 publishes it once the group has formed; a job that finished "
                                       "has none)"));
    }
    Say(absl::StrCat(Who(), ": waiting to join the job '", options_.run_id, "' at the rendezvous store ",
                     store_address_,
                     ": its group has not formed yet (its rank 0 says so once every worker it "
                     "started with joined), or the job has finished",
                     Waited(start, deadline)));
  }
  std::pair<int, int> group;
  std::vector<std::string> parts = absl::StrSplit(*v, ' ');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &group.first) || !absl::SimpleAtoi(parts[1], &group.second)) {
    return absl::DataLossError(absl::StrCat("bad group record '", *v, "' in the rendezvous store"));
  }
  return group;
}

absl::StatusOr<int> Rendezvous::ClaimRank(int world_size, int capacity) {
  absl::StatusOr<int64_t> n = store_->Add(absl::StrCat(options_.run_id, "/joined"), 1);
  if (!n.ok()) return n.status();
  const int64_t rank = world_size + *n - 1;
  if (rank >= capacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job '", options_.run_id, "' is full: its ", world_size,
                     " workers and those that joined since use all ", capacity,
                     " ranks it may grow to (start it with a larger max_world_size: GRADWIRE_MAX_WORLD_SIZE, "
                     "gradwire launch --max-workers)"));
  }
  return static_cast<int>(rank);
}

absl::StatusOr<int> Rendezvous::Ranks(int world_size, int capacity) {
  absl::StatusOr<int64_t> n = store_->Add(absl::StrCat(options_.run_id, "/joined"), 0);
  if (!n.ok()) return n.status();
  return static_cast<int>(std::min<int64_t>(world_size + *n, capacity));
}

absl::Status Rendezvous::MarkLeft(int rank) { return store_->Set(Key("left/", rank), "1"); }

bool Rendezvous::HasLeft(int rank) {
  std::shared_ptr<Store> store = Current();
  return store != nullptr && store->Get(Key("left/", rank), absl::Milliseconds(1)).ok();
}

absl::StatusOr<Rendezvous::Found> Rendezvous::FindMembers(int world_size, int capacity, int self, absl::Time deadline) {
  absl::StatusOr<int> ranks = Ranks(world_size, capacity);
  if (!ranks.ok()) return ranks.status();
  Found found;
  for (int r = 0; r < *ranks; ++r) {
    if (r == self) continue;
    // Start's group is complete (it published the group); a joiner may not have
    // announced itself yet (or never will: it died first).
    absl::StatusOr<WorkerInfo> w = Lookup(r, r < world_size ? deadline - absl::Now() : absl::Milliseconds(200));
    if (!w.ok()) {
      if (r < world_size) return w.status();
      continue;
    }
    if (HasLeft(r)) found.left.push_back(r);
    found.workers.push_back(*std::move(w));
  }
  return found;
}

absl::Status Rendezvous::ForgetRun() {
  if (etcd_ == nullptr) return absl::OkStatus();
  return etcd_->DeletePrefix(absl::StrCat(options_.run_id, "/")).status();
}

void Rendezvous::Close() {
  etcd_ = nullptr;
  std::shared_ptr<Store> closing;
  {
    absl::MutexLock lock(&mu_);
    closing.swap(store_);
  }
  closing.reset();  // unless a Lookup under way holds it: then when that ends
  if (server_) server_->Shutdown();
}

absl::StatusOr<std::string> RendezvousHost(const std::string& address) {
  if (IsEtcdUrl(address)) {
    absl::StatusOr<EtcdUrl> url = ParseEtcdUrl(address);
    if (!url.ok()) return url.status();
    return url->host;
  }
  absl::StatusOr<HostPort> hp = SplitHostPort(address);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad rendezvous address '", address, "' (expected host:port or etcd://HOST:PORT/JOB)"));
  }
  return hp->host;
}

}  // namespace gw::rpc::internal
