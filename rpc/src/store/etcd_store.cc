#include "store/etcd_store.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/proto/etcd.grpc.pb.h"
#include "gradwire/rpc/retry.h"
#include "security/grpc_credentials.h"
#include "transport/host_address.h"

namespace gw::rpc::internal {
namespace {

namespace pb = ::etcdserverpb;

constexpr char kRoot[] = "/gradwire/";

// Waits between attempts after UNAVAILABLE (the next attempt also waits for the channel
// to reconnect): short, since an etcd that restarts is back within about a second.
RetryPolicy Backoff() {
  RetryPolicy p;
  p.initial_backoff = absl::Milliseconds(20);
  p.max_backoff = absl::Milliseconds(500);
  return p;
}

bool IsJobChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

// The end of the range of keys starting with `prefix` (etcd's convention: the prefix with
// its last byte below 0xff incremented and what follows it dropped).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    auto last = static_cast<unsigned char>(prefix.back());
    if (last < 0xff) {
      prefix.back() = static_cast<char>(last + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string Quoted(const std::vector<std::string>& keys) {
  return absl::StrJoin(keys, ", ", [](std::string* out, const std::string& k) { absl::StrAppend(out, "'", k, "'"); });
}

std::string NewClientId() {
  std::random_device rd;
  const uint64_t id = (uint64_t{rd()} << 32) ^ uint64_t { rd() };
  return absl::StrCat(absl::Hex(id, absl::kZeroPad16));
}

void Prepare(grpc::ClientContext* ctx, absl::Time deadline) {
  ctx->set_wait_for_ready(true);  // while etcd is away, wait for the channel to reconnect
  if (deadline != absl::InfiniteFuture()) ctx->set_deadline(absl::ToChronoTime(deadline));
}

absl::Time DeadlineAfter(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                             : absl::Now() + std::max(timeout, absl::ZeroDuration());
}

std::string UnreachableHint(const EtcdUrl& url) {
  return absl::StrCat("cannot reach etcd at ", url.endpoint, " (rendezvous ", url.url,
                      "): is etcd running there, serving clients on that address (its --listen-client-urls and "
                      "--advertise-client-urls), and reachable from this host? `etcdctl --endpoints=",
                      url.endpoint, " endpoint health` checks");
}

class EtcdStoreImpl final : public EtcdStore {
 public:
  EtcdStoreImpl(EtcdUrl url, const std::shared_ptr<grpc::Channel>& channel)
      : url_(std::move(url)),
        channel_(channel),
        kv_(pb::KV::NewStub(channel)),
        watch_(pb::Watch::NewStub(channel)),
        receipt_key_(absl::StrCat(kRoot, url_.job, "#adds/", NewClientId())) {}

  ~EtcdStoreImpl() override {
    absl::MutexLock lock(&add_mu_);
    if (adds_ == 0) return;
    // The receipt of this client's Adds is of no use to anyone now (best effort).
    pb::DeleteRangeRequest req;
    req.set_key(receipt_key_);
    pb::DeleteRangeResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    (void)kv_->DeleteRange(&ctx, req, &resp);
  }

  // Something at the address answers etcd's KV API.
  absl::Status Probe(absl::Time deadline) {
    pb::RangeRequest req;
    req.set_key(url_.prefix);
    req.set_range_end(PrefixEnd(url_.prefix));
    req.set_count_only(true);
    pb::RangeResponse resp;
    grpc::Status s = Call(deadline, [&](grpc::ClientContext& ctx) { return kv_->Range(&ctx, req, &resp); });
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      return absl::FailedPreconditionError(
          absl::StrCat(url_.endpoint, " answers, but not as etcd (its v3 API is missing), for rendezvous ", url_.url,
                       "; for gradwire's own rendezvous store give HOST:PORT without etcd://"));
    }
    return s.ok() ? absl::OkStatus() : Failed(s, absl::StrCat("store ", url_.url));
  }

  absl::Status Set(const std::string& key, const std::string& value) override {
    pb::PutRequest req;
    req.set_key(Full(key));
    req.set_value(value);
    pb::PutResponse resp;
    grpc::Status s =
        Call(absl::Now() + kRpcTimeout, [&](grpc::ClientContext& ctx) { return kv_->Put(&ctx, req, &resp); });
    return s.ok() ? absl::OkStatus() : Failed(s, What("Set", key));
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::StatusOr<std::vector<std::string>> values = Await("Get", {key}, timeout);
    if (!values.ok()) return values.status();
    return std::move(values->front());
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return Await("Wait", keys, timeout).status();
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    const std::string what = What("Add", key), full = Full(key);
    const absl::Time deadline = absl::Now() + kRpcTimeout;
    absl::MutexLock lock(&add_mu_);
    const std::string receipt = absl::StrCat(++adds_);
    pb::TxnRequest read;  // the counter and this client's receipt, at one revision
    read.add_success()->mutable_request_range()->set_key(full);
    read.add_success()->mutable_request_range()->set_key(receipt_key_);
    pb::TxnResponse current;
    if (grpc::Status s = Call(deadline, [&](grpc::ClientContext& ctx) { return kv_->Txn(&ctx, read, &current); });
        !s.ok()) {
      return Failed(s, what);
    }
    pb::RangeResponse counter = current.responses(0).response_range();
    for (int attempt = 0;; ++attempt) {
      int64_t value = 0;
      pb::TxnRequest txn;
      pb::Compare* unchanged = txn.add_compare();
      unchanged->set_key(full);
      unchanged->set_result(pb::Compare::EQUAL);
      if (counter.kvs_size() == 0) {
        unchanged->set_target(pb::Compare::VERSION);  // still absent
        unchanged->set_version(0);
      } else {
        if (!absl::SimpleAtoi(counter.kvs(0).value(), &value)) {
          return absl::FailedPreconditionError(absl::StrCat(what, ": store key '", key, "' does not hold a counter"));
        }
        unchanged->set_target(pb::Compare::MOD);
        unchanged->set_mod_revision(counter.kvs(0).mod_revision());
      }
      const int64_t next = value + delta;
      pb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(full);
      put->set_value(absl::StrCat(next));
      put = txn.add_success()->mutable_request_put();
      put->set_key(receipt_key_);
      put->set_value(receipt);
      txn.add_failure()->mutable_request_range()->set_key(full);
      pb::TxnResponse resp;
      grpc::ClientContext ctx;
      Prepare(&ctx, deadline);
      grpc::Status s = AtDeadline(kv_->Txn(&ctx, txn, &resp), deadline);
      if (s.ok()) {
        if (resp.succeeded()) return next;
        counter = resp.responses(0).response_range();  // another client got in first
        continue;
      }
      const absl::Duration backoff = Backoff().Backoff(attempt);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() + backoff >= deadline) {
        return Failed(s, what);
      }
      absl::SleepFor(backoff);
      // The Txn may have been applied before etcd went away: the receipt says whether.
      if (s = Call(deadline, [&](grpc::ClientContext& c) { return kv_->Txn(&c, read, &current); }); !s.ok()) {
        return Failed(s, what);
      }
      const pb::RangeResponse& mine = current.responses(1).response_range();
      if (mine.kvs_size() > 0 && mine.kvs(0).value() == receipt) return next;
      counter = current.responses(0).response_range();
    }
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    absl::StatusOr<int64_t> deleted = DeleteRange("Delete", key, Full(key), "");
    if (!deleted.ok()) return deleted.status();
    return *deleted > 0;
  }

  absl::StatusOr<int64_t> DeletePrefix(const std::string& key_prefix) override {
    const std::string full = Full(key_prefix);
    return DeleteRange("DeletePrefix", key_prefix, full, PrefixEnd(full));
  }

 private:
  std::string Full(const std::string& key) const { return absl::StrCat(url_.prefix, key); }

  std::string What(const char* op, const std::string& key) const {
    return absl::StrCat("store ", url_.url, " ", op, "('", key, "')");
  }

  // etcd may see a call's deadline pass before the client does and answer UNKNOWN
  // "context deadline exceeded": past the deadline, any failure is DEADLINE_EXCEEDED.
  static grpc::Status AtDeadline(grpc::Status s, absl::Time deadline) {
    if (s.ok() || absl::Now() < deadline) return s;
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, s.error_message());
  }

  // Runs one RPC (`rpc(ctx)`) until it returns anything but UNAVAILABLE or `deadline`
  // passes; each attempt waits for the channel to be connected.
  template <typename Rpc>
  grpc::Status Call(absl::Time deadline, Rpc&& rpc) {
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      Prepare(&ctx, deadline);
      grpc::Status s = AtDeadline(rpc(ctx), deadline);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return s;
      const absl::Duration backoff = Backoff().Backoff(attempt);
      if (absl::Now() + backoff >= deadline) return s;
      absl::SleepFor(backoff);
    }
  }

  // A failed RPC as the failure model words it: UNAVAILABLE when etcd cannot be reached,
  // DEADLINE_EXCEEDED when it was reached but did not answer in time.
  absl::Status Failed(const grpc::Status& s, const std::string& what) const {
    const bool reachable = channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !reachable)) {
      return absl::UnavailableError(absl::StrCat(what, ": ", UnreachableHint(url_), " (", s.error_message(), ")"));
    }
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat(what, ": etcd at ", url_.endpoint, ": ", s.error_message()));
  }

  absl::StatusOr<int64_t> DeleteRange(const char* op, const std::string& key, const std::string& full,
                                      const std::string& range_end) {
    pb::DeleteRangeRequest req;
    req.set_key(full);
    req.set_range_end(range_end);
    pb::DeleteRangeResponse resp;
    grpc::Status s =
        Call(absl::Now() + kRpcTimeout, [&](grpc::ClientContext& ctx) { return kv_->DeleteRange(&ctx, req, &resp); });
    if (!s.ok()) return Failed(s, What(op, key));
    return resp.deleted();
  }

  // Get and Wait: the values of `keys` once all exist. Reads them at one revision; while
  // some are missing, watches those from the next revision until each was put, then reads
  // again (a key deleted meanwhile is waited for again).
  absl::StatusOr<std::vector<std::string>> Await(const char* op, const std::vector<std::string>& keys,
                                                 absl::Duration timeout) {
    const absl::Time deadline = DeadlineAfter(timeout);
    const std::string what = What(op, keys.empty() ? "" : keys.front());
    if (keys.empty()) return std::vector<std::string>();
    pb::TxnRequest read;
    for (const std::string& k : keys) read.add_success()->mutable_request_range()->set_key(Full(k));
    for (int attempt = 0;; ++attempt) {
      pb::TxnResponse snapshot;
      // A read gets at least kLookTime, so that a short (or zero) timeout still looks once.
      grpc::Status s = Call(std::max(deadline, absl::Now() + kLookTime),
                            [&](grpc::ClientContext& ctx) { return kv_->Txn(&ctx, read, &snapshot); });
      if (!s.ok()) return Failed(s, absl::StrCat(what, " (waiting for ", Quoted(keys), ")"));
      std::vector<std::string> values(keys.size()), missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        const pb::RangeResponse& range = snapshot.responses(static_cast<int>(i)).response_range();
        if (range.kvs_size() == 0) {
          missing.push_back(keys[i]);
        } else {
          values[i] = range.kvs(0).value();
        }
      }
      if (missing.empty()) return values;
      grpc::Status watched =
          absl::Now() < deadline
              ? AtDeadline(WatchUntilPut(missing, snapshot.header().revision() + 1, deadline), deadline)
              : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed");
      if (watched.ok()) continue;  // read again
      const absl::Duration backoff = Backoff().Backoff(attempt);
      if (watched.error_code() == grpc::StatusCode::UNAVAILABLE && absl::Now() + backoff < deadline) {
        absl::SleepFor(backoff);  // etcd went away: read and watch again once it is back
        continue;
      }
      const std::string not_there = absl::StrCat(what, ": store key", missing.size() > 1 ? "s " : " ", Quoted(missing),
                                                 " did not appear in time");
      if (watched.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
          channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
        return absl::DeadlineExceededError(not_there);
      }
      return Failed(watched, not_there);
    }
  }

  // Watches `keys` from `revision` (inclusive) until each has been put (OK) or etcd
  // cancels the watch because its history was compacted (OK too: the caller reads
  // again); a watch cancelled for another reason is FAILED_PRECONDITION with etcd's;
  // otherwise the stream's end: DEADLINE_EXCEEDED, or UNAVAILABLE when etcd went away.
  grpc::Status WatchUntilPut(const std::vector<std::string>& keys, int64_t revision, absl::Time deadline) {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline);
    auto stream = watch_->Watch(&ctx);
    absl::flat_hash_set<std::string> pending;
    bool writing = true;
    for (const std::string& k : keys) {
      pb::WatchRequest req;
      pb::WatchCreateRequest* create = req.mutable_create_request();
      create->set_key(Full(k));
      create->set_start_revision(revision);
      pending.insert(create->key());
      if (!(writing = stream->Write(req))) break;
    }
    bool cancelled = false;
    std::string refused;  // why etcd cancelled a watch, other than compaction
    pb::WatchResponse resp;
    while (writing && !pending.empty() && !cancelled && stream->Read(&resp)) {
      cancelled = resp.canceled();
      if (cancelled && resp.compact_revision() == 0) {
        refused = resp.cancel_reason().empty() ? "etcd cancelled the watch" : resp.cancel_reason();
      }
      for (const pb::Event& e : resp.events()) {
        if (e.type() == pb::Event::PUT) {
          pending.erase(e.kv().key());
        } else {
          pending.insert(e.kv().key());
        }
      }
    }
    const bool done = writing && (pending.empty() || cancelled);
    if (done) ctx.TryCancel();
    while (stream->Read(&resp)) {
    }
    grpc::Status s = stream->Finish();
    if (!refused.empty()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, refused);
    return done ? grpc::Status::OK : s;
  }

  static constexpr absl::Duration kLookTime = absl::Seconds(1);

  const EtcdUrl url_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<pb::KV::Stub> kv_;
  const std::unique_ptr<pb::Watch::Stub> watch_;
  const std::string receipt_key_;  // where this client's Adds leave their receipt
  absl::Mutex add_mu_;
  int64_t adds_ ABSL_GUARDED_BY(add_mu_) = 0;
};

}  // namespace

bool IsEtcdUrl(absl::string_view address) { return absl::StartsWith(address, kEtcdScheme); }

absl::StatusOr<EtcdUrl> ParseEtcdUrl(absl::string_view address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad etcd rendezvous address '", address, "': ", why,
        "; expected etcd://HOST:PORT/JOB, e.g. etcd://10.0.0.1:2379/my-job (JOB: letters, digits, '.', '_', '-')"));
  };
  if (!IsEtcdUrl(address)) return bad("it does not start with etcd://");
  const absl::string_view rest = address.substr(kEtcdScheme.size());
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos) return bad("the job name (/JOB after HOST:PORT) is missing");
  EtcdUrl url;
  url.url = std::string(address);
  url.endpoint = std::string(rest.substr(0, slash));
  url.job = std::string(rest.substr(slash + 1));
  absl::StatusOr<HostPort> hp = SplitHostPort(url.endpoint);
  if (!hp.ok() || hp->host.empty() || hp->port == 0) return bad(absl::StrCat("'", url.endpoint, "' is not HOST:PORT"));
  url.host = hp->host;
  if (url.job.empty() || !std::all_of(url.job.begin(), url.job.end(), IsJobChar)) {
    return bad(url.job.empty() ? "the job name is empty"
                               : absl::StrCat("job name '", url.job, "' has other characters"));
  }
  url.prefix = absl::StrCat(kRoot, url.job, "/");
  return url;
}

absl::StatusOr<std::unique_ptr<EtcdStore>> ConnectEtcdStore(const std::string& address, absl::Time deadline,
                                                            const TlsOptions& tls) {
  absl::StatusOr<EtcdUrl> url = ParseEtcdUrl(address);
  if (!url.ok()) return url.status();
  grpc::ChannelArguments args;
  // Back soon after etcd restarts; notice a silent peer on another machine.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = ChannelCredentials(tls, &args, /*check_host=*/true);
  if (!creds.ok()) return creds.status();
  auto channel = grpc::CreateCustomChannel(url->endpoint, *creds, args);
  if (!channel->WaitForConnected(absl::ToChronoTime(deadline))) {
    return absl::UnavailableError(UnreachableHint(*url));
  }
  auto store = std::make_unique<EtcdStoreImpl>(*url, channel);
  if (absl::Status s = store->Probe(deadline); !s.ok()) return s;
  return std::unique_ptr<EtcdStore>(std::move(store));
}

}  // namespace gw::rpc::internal
