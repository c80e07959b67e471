#include "server/local/instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ferry::server {
namespace {

// Whether something accepts connections on the Unix socket at `path`.
bool SocketAnswers(const std::string& path) {
  sockaddr_un addr = {};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  return connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

std::string HolderPid(int fd) {
  char text[32] = {};
  ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  std::string pid =
      n > 0 ? std::string(absl::StripAsciiWhitespace(absl::string_view(text, n))) : "";
  return pid.empty() ? "unknown" : pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<InstanceLock>> InstanceLock::Acquire(const std::string& socket_path,
                                                                     absl::Duration wait) {
  std::string lock_path = absl::StrCat(socket_path, ".lock");
  UniqueFd fd(open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return absl::ErrnoToStatus(errno, absl::StrCat("open(", lock_path, ")"));
  absl::Time deadline = absl::Now() + wait;
  while (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK)
      return absl::ErrnoToStatus(errno, absl::StrCat("flock(", lock_path, ")"));
    if (SocketAnswers(socket_path)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "another ferryd (pid ", HolderPid(fd.get()), ") serves ", socket_path,
          "; stop it first, or give this one another listen.local"));
    }
    if (absl::Now() >= deadline) {
      return absl::FailedPreconditionError(
          absl::StrCat("another ferryd (pid ", HolderPid(fd.get()), ") holds ", lock_path,
                       " and did not let go within ", absl::FormatDuration(wait)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd.get(), 0) != 0 || pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("write(", lock_path, ")"));
  }
  // Ours now: whatever is at the path was left by an agent that is gone.
  if (unlink(socket_path.c_str()) != 0 && errno != ENOENT) {
    return absl::ErrnoToStatus(errno, absl::StrCat("unlink(", socket_path, ") (a stale socket)"));
  }
  return std::unique_ptr<InstanceLock>(
      new InstanceLock(socket_path, std::move(lock_path), std::move(fd)));
}

void InstanceLock::NoteSocketBound() {
  struct stat st = {};
  if (stat(socket_path_.c_str(), &st) == 0) {
    socket_dev_ = st.st_dev;
    socket_ino_ = st.st_ino;
  }
}

void InstanceLock::RemoveSocket() {
  if (socket_ino_ == 0) return;
  struct stat st = {};
  if (stat(socket_path_.c_str(), &st) == 0 && st.st_dev == socket_dev_ &&
      st.st_ino == socket_ino_) {
    unlink(socket_path_.c_str());
  }
  socket_ino_ = 0;
}

InstanceLock::~InstanceLock() {
  RemoveSocket();
  // The lock file stays: removing it would let two agents lock two different files.
  flock(fd_.get(), LOCK_UN);
}

}  // namespace ferry::server
