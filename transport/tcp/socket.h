#pragma once
// TCP socket helpers for the tcp provider: blocking ones for connecting and the hello, and
// the errno mapping the event loops share. Every error names the call and errno.

#include <sys/uio.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace ferry::tcp {

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

absl::StatusOr<HostPort> ParseHostPort(const std::string& address);

// Listens on host:port (port 0: any free port); `bound_port` receives the port chosen.
absl::StatusOr<UniqueFd> ListenTcp(const std::string& address, uint16_t* bound_port);

// Connects with TCP_NODELAY set (small acks must not wait for Nagle). A `source_host`
// ("127.0.0.3", a rail's address) binds the socket to it first, so the connection leaves
// through that NIC's address; "" lets the kernel choose.
absl::StatusOr<UniqueFd> ConnectTcp(const std::string& address,
                                    const std::string& source_host = "");

// Sends all bytes described by `iov` (modified in place). UNAVAILABLE when the peer left.
absl::Status SendAll(int fd, struct iovec* iov, int iovcnt);
absl::Status SendAll(int fd, const void* data, uint64_t length);

// Receives exactly `length` bytes. UNAVAILABLE on EOF (the message says "closed").
absl::Status RecvAll(int fd, void* data, uint64_t length);

// Receives and drops `length` bytes (the payload of a refused WRITE).
absl::Status Discard(int fd, uint64_t length);

// Makes `fd` non-blocking, for the event loops.
absl::Status SetNonBlocking(int fd);

// `call` failed with `err`: UNAVAILABLE when the peer went away (reset, pipe, refused,
// unreachable), otherwise the errno's own code.
absl::Status SocketError(int err, const std::string& call);

}  // namespace ferry::tcp
