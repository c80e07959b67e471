#include "server/local/local_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "grpcpp/server_posix.h"
#include "server/local/unix_socket.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

// ErrnoToStatus appends errno's description itself: "bind(/run/ferry.sock): Permission denied".
absl::Status Errno(const std::string& call) { return absl::ErrnoToStatus(errno, call); }

}  // namespace

absl::StatusOr<std::unique_ptr<LocalListener>> LocalListener::Bind(const std::string& path,
                                                                   mode_t mode, gid_t group,
                                                                   LocalCallers* callers) {
  ASSIGN_OR_RETURN(UniqueFd fd, ListenUnix(path, mode, group, "listen.local"));
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return Errno("eventfd");
  return std::unique_ptr<LocalListener>(new LocalListener(std::move(fd), std::move(wake), callers));
}

LocalListener::~LocalListener() { Stop(); }

void LocalListener::Serve(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void LocalListener::Stop() {
  uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) < 0) {
    spdlog::warn("local socket: waking the accept thread: {}", strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
}

void LocalListener::AcceptLoop(grpc::Server* server) {
  while (true) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("local socket: poll: {}; no more local connections", strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    // Non-blocking, as gRPC's own accepted sockets are: its event engine expects it.
    int conn = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      // Out of fds: they come back as connections close.
      spdlog::warn("local socket: accept: {}", strerror(errno));
      poll(nullptr, 0, 50);
      continue;
    }
    ucred cred = {};
    socklen_t len = sizeof(cred);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      spdlog::warn("local socket: getsockopt(SO_PEERCRED): {}; connection closed",
                   strerror(errno));
      close(conn);
      continue;
    }
    callers_->Record(conn, {cred.uid, cred.gid, cred.pid});
    // gRPC owns the fd from here and closes it with the connection.
    grpc::AddInsecureChannelFromFd(server, conn);
  }
}

}  // namespace ferry::server
