#include "transport/host_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gw::rpc::internal {
namespace {

std::string Unbracketed(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

}  // namespace

absl::StatusOr<HostPort> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  HostPort hp;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(address.substr(colon + 1), &hp.port) ||
      hp.port < 0 || hp.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad address '", address, "' (expected host:port or [v6]:port)"));
  }
  hp.host = Unbracketed(address.substr(0, colon));
  return hp;
}

std::string JoinHostPort(const std::string& host, int port) {
  const std::string h = Unbracketed(host);
  return h.find(':') != std::string::npos ? absl::StrCat("[", h, "]:", port) : absl::StrCat(h, ":", port);
}

bool IsLoopbackHost(const std::string& host) {
  const std::string h = Unbracketed(host);
  if (absl::AsciiStrToLower(h) == "localhost") return true;
  in_addr v4;
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

bool IsWildcardHost(const std::string& host) {
  const std::string h = Unbracketed(host);
  in_addr v4;
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return v4.s_addr == htonl(INADDR_ANY);
  in6_addr v6;
  return ::inet_pton(AF_INET6, h.c_str(), &v6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&v6);
}

absl::StatusOr<std::string> LocalAddressToward(const std::string& host) {
  const std::string h = Unbracketed(host);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  // Port 9 (discard): connect() needs one; nothing is ever sent.
  if (const int rc = ::getaddrinfo(h.c_str(), "9", &hints, &found); rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve host '", h, "': ", ::gai_strerror(rc)));
  }
  std::string error = "no address";
  std::string local;
  for (addrinfo* ai = found; ai != nullptr && local.empty(); ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = absl::StrCat("socket: ", std::strerror(errno));
      continue;
    }
    sockaddr_storage self{};
    socklen_t len = sizeof(self);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      error = absl::StrCat("no route: ", std::strerror(errno));
    } else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) != 0) {
      error = absl::StrCat("getsockname: ", std::strerror(errno));
    } else {
      char text[INET6_ADDRSTRLEN] = {};
      const void* ip = self.ss_family == AF_INET6
                           ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&self)->sin6_addr)
                           : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&self)->sin_addr);
      if (::inet_ntop(self.ss_family, ip, text, sizeof(text)) != nullptr) local = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (local.empty()) {
    return absl::UnavailableError(absl::StrCat("this host has no address that reaches '", h, "' (", error, ")"));
  }
  return local;
}

}  // namespace gw::rpc::internal
