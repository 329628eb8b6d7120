#include "gradwire/rpc/metrics_endpoint.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"

namespace gw::rpc {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr size_t kMaxRequestBytes = 8 << 10;
constexpr auto kIdleTimeout = std::chrono::seconds(10);
constexpr int kMaxConnections = 64;
constexpr char kTokenLabel[] = "gradwire metrics endpoint v1";

std::string_view ToStd(boost::beast::string_view s) { return {s.data(), s.size()}; }

bool EqualConstantTime(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

std::string MetricsToken(const std::string& secret) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(kTokenLabel), sizeof(kTokenLabel) - 1, mac, &len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), len));
}

std::string ToExposition(const std::vector<Sample>& samples) {
  auto strip = [](absl::string_view name, absl::string_view suffix) -> std::optional<absl::string_view> {
    if (!absl::EndsWith(name, suffix)) return std::nullopt;
    return name.substr(0, name.size() - suffix.size());
  };
  // Histogram families: the bases of _bucket samples with an "le" label.
  std::set<std::string, std::less<>> histograms;
  for (const Sample& s : samples) {
    if (auto base = strip(s.name, "_bucket"); base && s.labels.contains("le")) histograms.emplace(*base);
  }
  auto family_of = [&](const std::string& name) -> std::string {
    for (absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
      if (auto base = strip(name, suffix); base && histograms.contains(*base)) return std::string(*base);
    }
    return name;
  };
  // Families in the order they first appear, each with its samples.
  std::vector<std::pair<std::string, std::vector<Sample>>> families;
  std::map<std::string, size_t, std::less<>> index;
  for (const Sample& s : samples) {
    std::string family = family_of(s.name);
    auto [it, added] = index.try_emplace(family, families.size());
    if (added) families.emplace_back(std::move(family), std::vector<Sample>{});
    families[it->second].second.push_back(s);
  }
  std::string out;
  for (const auto& [family, members] : families) {
    const char* type = histograms.contains(family)        ? "histogram"
                       : absl::EndsWith(family, "_total") ? "counter"
                                                          : "gauge";
    absl::StrAppend(&out, "# TYPE ", family, " ", type, "\n", ToText(members));
  }
  return out;
}

struct MetricsEndpoint::Impl {
  Impl(const Statistics& statistics, MetricsEndpointOptions options, const Waits* waits)
      : statistics(statistics), waits(waits), options(std::move(options)) {}

  class Session;
  void Accept();
  http::response<http::string_body> Answer(const http::request<http::string_body>& req) const;

  const Statistics& statistics;
  const Waits* const waits;
  const MetricsEndpointOptions options;
  std::atomic<int> connections{0};  // open sessions (they count themselves out as the io_context goes)
  int port = 0;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
};

class MetricsEndpoint::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& endpoint, tcp::socket socket) : endpoint_(endpoint), stream_(std::move(socket)) {
    endpoint_.connections.fetch_add(1);
  }
  ~Session() { endpoint_.connections.fetch_sub(1); }

  void Read() {
    parser_.emplace();
    parser_->header_limit(kMaxRequestBytes);
    parser_->body_limit(kMaxRequestBytes);
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec) {
      // The peer closed, went idle past the timeout, or sent what is not HTTP within the
      // limits: nothing to answer.
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      return;
    }
    http::request<http::string_body> req = parser_->release();
    response_ = endpoint_.Answer(req);
    response_.keep_alive(req.keep_alive());
    response_.prepare_payload();
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec || !self->response_.keep_alive()) {
        beast::error_code ignored;
        self->stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
        return;
      }
      self->Read();
    });
  }

  Impl& endpoint_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kMaxRequestBytes};
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
};

http::response<http::string_body> MetricsEndpoint::Impl::Answer(const http::request<http::string_body>& req) const {
  http::response<http::string_body> res;
  res.version(req.version());
  res.set(http::field::server, "gradwire");
  res.set(http::field::content_type, "text/plain; charset=utf-8");
  auto fail = [&](http::status status, std::string body) {
    res.result(status);
    res.body() = std::move(body);
    return res;
  };
  if (!options.bearer_token.empty() &&
      !EqualConstantTime(ToStd(req[http::field::authorization]), "Bearer " + options.bearer_token)) {
    res.set(http::field::www_authenticate, "Bearer");
    return fail(http::status::unauthorized,
                absl::StrCat(options.owner, ": this metrics endpoint asks for \"Authorization: Bearer <token>\", the ",
                             "job's metrics token (gradwire secret --metrics-token)\n"));
  }
  if (req.method() != http::verb::get) {
    res.set(http::field::allow, "GET");
    return fail(http::status::method_not_allowed, "only GET is served\n");
  }
  const std::string target = std::string(ToStd(req.target()));
  const std::string path = target.substr(0, target.find('?'));
  if (path == "/metrics") {
    res.result(http::status::ok);
    res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.body() = ToExposition(statistics.Collect());
    return res;
  }
  if (path == "/waits" && waits != nullptr) {
    res.result(http::status::ok);
    res.set(http::field::content_type, "application/json");
    res.body() =
        WaitsToJson({.worker = options.owner, .rank = options.rank, .answered = true, .waits = waits->Collect()});
    return res;
  }
  if (path == "/") return fail(http::status::ok, absl::StrCat(options.owner, "'s metrics are at /metrics\n"));
  return fail(http::status::not_found, absl::StrCat("no ", path, " here: the metrics are at /metrics\n"));
}

void MetricsEndpoint::Impl::Accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // closing
    if (!ec) {
      if (connections.load() >= kMaxConnections) {
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        std::make_shared<Session>(*this, std::move(socket))->Read();
      }
    }
    Accept();
  });
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsEndpoint::~MetricsEndpoint() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The sessions' handlers, still queued in the io_context, go with it (their sockets
  // close); the acceptor closes first.
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const Statistics& statistics,
                                                                        MetricsEndpointOptions options,
                                                                        const Waits* waits) {
  auto impl = std::make_unique<Impl>(statistics, std::move(options), waits);
  const MetricsEndpointOptions& o = impl->options;
  const std::string where = absl::StrCat(o.host, ":", o.port);
  auto refuse = [&](const std::string& what, const beast::error_code& ec, const char* hint) {
    return absl::FailedPreconditionError(
        absl::StrCat(o.owner, ": the metrics endpoint cannot ", what, " ", where, ": ", ec.message(), hint));
  };
  if (o.port < 0 || o.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.owner, ": metrics port ", o.port, " is not a TCP port (0-65535; 0: any free one)"));
  }
  beast::error_code ec;
  tcp::resolver resolver(impl->io);
  auto endpoints = resolver.resolve(o.host, std::to_string(o.port), tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    return refuse("resolve", ec, " (GRADWIRE_METRICS_HOST: an address of this host, such as 127.0.0.1)");
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (ec) {
    return refuse("listen on", ec,
                  ec == asio::error::address_in_use
                      ? " (another process has that port: give this worker a free one, GRADWIRE_METRICS_PORT or "
                        "gradwire launch --metrics-port)"
                      : " (GRADWIRE_METRICS_HOST: an address of this host)");
  }
  impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return refuse("listen on", ec, "");
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    pthread_setname_np(pthread_self(), "gw-metrics");
    raw->io.run();
  });
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl)));
}

int MetricsEndpoint::port() const { return impl_->port; }

std::string MetricsEndpoint::url() const {
  const std::string& host = impl_->options.host;
  const bool v6 = host.find(':') != std::string::npos;
  return absl::StrCat("http://", v6 ? "[" : "", host, v6 ? "]" : "", ":", impl_->port, "/metrics");
}

absl::StatusOr<std::string> ReadEndpoint(const std::string& address, const std::string& path,
                                         const std::string& bearer_token, absl::Duration timeout) {
  const std::string url = absl::StrCat("http://", address, path);
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(url, ": the address is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  asio::io_context io;
  beast::tcp_stream stream(io);
  const auto budget = std::chrono::microseconds(absl::ToInt64Microseconds(timeout));
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(host, port, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(url, ": cannot resolve ", host, ": ", ec.message()));
  // Every step runs under the one deadline: a frozen worker costs `timeout`, no more.
  http::request<http::empty_body> req{http::verb::get, path, 11};
  req.set(http::field::host, address);
  req.set(http::field::user_agent, "gradwire");
  if (!bearer_token.empty()) req.set(http::field::authorization, "Bearer " + bearer_token);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  stream.expires_after(budget);
  stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) {
    if (e) {
      ec = e;
      return;
    }
    http::async_write(stream, req, [&](beast::error_code e, size_t) {
      if (e) {
        ec = e;
        return;
      }
      http::async_read(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
    });
  });
  io.run();
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat(url, ": ", ec == beast::error::timeout ? "no answer within " : "",
                     ec == beast::error::timeout ? absl::FormatDuration(timeout) : ec.message()));
  }
  const http::response<http::string_body>& res = parser.get();
  if (res.result() == http::status::unauthorized) {
    return absl::UnauthenticatedError(absl::StrCat(url, " asks for the job's metrics token: give the job's secret ",
                                                   "(GRADWIRE_SECRET_FILE or GRADWIRE_SECRET)"));
  }
  if (res.result() != http::status::ok) {
    return absl::UnknownError(absl::StrCat(url, " answered ", res.result_int(), ": ", res.body()));
  }
  return res.body();
}

}  // namespace gw::rpc
