#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ferry::tcp {

absl::Status SocketError(int err, const std::string& call) {
  // A peer that went away is UNAVAILABLE to callers, whatever errno says exactly.
  if (err == EPIPE || err == ECONNRESET || err == ECONNREFUSED || err == ETIMEDOUT ||
      err == EHOSTUNREACH || err == ENETUNREACH || err == ECONNABORTED) {
    return absl::UnavailableError(absl::StrCat(call, ": ", strerror(err)));
  }
  return absl::ErrnoToStatus(err, call);
}

absl::Status SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return absl::ErrnoToStatus(errno, "fcntl(F_GETFL)");
  if (fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::ErrnoToStatus(errno, "fcntl(F_SETFL, O_NONBLOCK)");
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<addrinfo*> Resolve(const HostPort& hp, bool passive) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  std::string port = std::to_string(hp.port);
  int rc = getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("getaddrinfo(", hp.host, ":", hp.port, "): ", gai_strerror(rc)));
  }
  return result;
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(const std::string& address) {
  size_t colon = address.rfind(':');
  HostPort hp;
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  hp.host = address.substr(0, colon);
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']') {
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  }
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

absl::StatusOr<UniqueFd> ListenTcp(const std::string& address, uint16_t* bound_port) {
  auto hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  auto ai = Resolve(*hp, /*passive=*/true);
  if (!ai.ok()) return ai.status();
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(*ai, freeaddrinfo);
  UniqueFd fd(socket(list->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::ErrnoToStatus(errno, "socket()");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), list->ai_addr, list->ai_addrlen) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("bind(", address, ")"));
  }
  if (listen(fd.get(), 128) != 0) return absl::ErrnoToStatus(errno, "listen()");
  sockaddr_storage ss = {};
  socklen_t len = sizeof(ss);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return absl::ErrnoToStatus(errno, "getsockname()");
  }
  *bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

absl::StatusOr<UniqueFd> ConnectTcp(const std::string& address, const std::string& source_host) {
  auto hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  auto ai = Resolve(*hp, /*passive=*/false);
  if (!ai.ok()) return ai.status();
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(*ai, freeaddrinfo);
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> source(nullptr, freeaddrinfo);
  if (!source_host.empty()) {
    auto from = Resolve(HostPort{source_host, 0}, /*passive=*/false);
    if (!from.ok()) return from.status();
    source.reset(*from);
  }
  int last_errno = 0;
  for (addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return absl::ErrnoToStatus(errno, "socket()");
    if (source && bind(fd.get(), source->ai_addr, source->ai_addrlen) != 0) {
      return SocketError(errno, absl::StrCat("bind(", source_host, ") before connect(", address,
                                             ")"));
    }
    if (connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) {
      int one = 1;
      setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    last_errno = errno;
  }
  return SocketError(last_errno, absl::StrCat("connect(", address, ")"));
}

absl::Status SendAll(int fd, struct iovec* iov, int iovcnt) {
  while (iovcnt > 0) {
    msghdr msg = {};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(iovcnt, IOV_MAX));
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SocketError(errno, "sendmsg()");
    }
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status SendAll(int fd, const void* data, uint64_t length) {
  iovec iov = {const_cast<void*>(data), length};
  return SendAll(fd, &iov, 1);
}

absl::Status RecvAll(int fd, void* data, uint64_t length) {
  char* p = static_cast<char*>(data);
  while (length > 0) {
    ssize_t n = recv(fd, p, length, MSG_WAITALL);
    if (n == 0) return absl::UnavailableError("recv(): connection closed by peer");
    if (n < 0) {
      if (errno == EINTR) continue;
      return SocketError(errno, "recv()");
    }
    p += n;
    length -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status Discard(int fd, uint64_t length) {
  std::vector<char> sink(std::min<uint64_t>(length, 64 * 1024));
  while (length > 0) {
    uint64_t n = std::min<uint64_t>(length, sink.size());
    absl::Status s = RecvAll(fd, sink.data(), n);
    if (!s.ok()) return s;
    length -= n;
  }
  return absl::OkStatus();
}

}  // namespace ferry::tcp
