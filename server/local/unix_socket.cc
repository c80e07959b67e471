#include "server/local/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ferry::server {

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode, gid_t group,
                                    const std::string& key) {
  // ErrnoToStatus appends errno's description itself: "bind(/run/ferry.sock): Permission denied".
  auto errno_status = [](const std::string& call) { return absl::ErrnoToStatus(errno, call); };
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", path, " is longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return errno_status("socket(AF_UNIX)");
  unlink(path.c_str());
  // The mode is set on the file before anyone can connect: bind() under a umask that
  // leaves only the owner, then chmod to what config asks.
  mode_t old = umask(0077);
  int bound = bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old);
  if (bound != 0) return errno_status(absl::StrCat("bind(", path, ")"));
  if (group != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    return errno_status(absl::StrCat("chown(", path, ", group ", group, ")"));
  }
  if (chmod(path.c_str(), mode) != 0) return errno_status(absl::StrCat("chmod(", path, ")"));
  if (listen(fd.get(), 128) != 0) return errno_status(absl::StrCat("listen(", path, ")"));
  return fd;
}

}  // namespace ferry::server
