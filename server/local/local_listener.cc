#include "server/local/local_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

// ErrnoToStatus appends errno's description itself: "bind(/run/ferry.sock): Permission denied".
absl::Status Errno(const std::string& call) { return absl::ErrnoToStatus(errno, call); }

}  // namespace

absl::StatusOr<std::unique_ptr<LocalListener>> LocalListener::Bind(const std::string& path,
                                                                   mode_t mode, gid_t group,
                                                                   LocalCallers* callers) {
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("listen.local: ", path, " is longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Errno("socket(AF_UNIX)");
  unlink(path.c_str());
  // The mode is set on the file before anyone can connect: bind() under a umask that
  // leaves only the owner, then chmod to what config asks.
  mode_t old = umask(0077);
  int bound = bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old);
  if (bound != 0) return Errno(absl::StrCat("bind(", path, ")"));
  if (group != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    return Errno(absl::StrCat("chown(", path, ", group ", group, ")"));
  }
  if (chmod(path.c_str(), mode) != 0) return Errno(absl::StrCat("chmod(", path, ")"));
  if (listen(fd.get(), 128) != 0) return Errno(absl::StrCat("listen(", path, ")"));
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
