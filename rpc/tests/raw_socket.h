// Raw loopback sockets for the transport and security tests: a peer that sends bytes of
// its choosing, bypassing every transport.
#ifndef GRADWIRE_RPC_TESTS_RAW_SOCKET_H_
#define GRADWIRE_RPC_TESTS_RAW_SOCKET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"

namespace gw::rpc::testing {

// A raw TCP socket connected to `address` ("host:port", the host taken as 127.0.0.1); -1
// if it cannot connect.
inline int DialRaw(const std::string& address) {
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_RAW_SOCKET_H_
