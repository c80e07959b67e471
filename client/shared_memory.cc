#include "client/shared_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/fd_passing.h"
#include "base/status_macros.h"

namespace ferry {
namespace {

constexpr char kHowToShare[] =
    "allocate it shared: ferry.empty() / Client.alloc(), a torch tensor after "
    "share_memory_(), a numpy array over multiprocessing.shared_memory, or memory mapped "
    "MAP_SHARED from a memfd or /dev/shm file";

// One line of /proc/self/maps.
struct Mapping {
  uint64_t start = 0, end = 0;
  std::string perms;
  uint64_t offset = 0;
  dev_t dev = 0;
  uint64_t inode = 0;
  std::string path;
};

bool ParseMapping(const std::string& line, Mapping* m) {
  // start-end perms offset dev inode [path]
  std::istringstream in(line);
  std::string range, dev;
  if (!(in >> range >> m->perms >> std::hex >> m->offset >> dev >> std::dec >> m->inode)) {
    return false;
  }
  std::getline(in, m->path);
  m->path.erase(0, m->path.find_first_not_of(' '));
  std::pair<std::string, std::string> ends = absl::StrSplit(range, '-');
  std::pair<std::string, std::string> major_minor = absl::StrSplit(dev, ':');
  uint32_t major = 0, minor = 0;
  if (!absl::SimpleHexAtoi(major_minor.first, &major) ||
      !absl::SimpleHexAtoi(major_minor.second, &minor)) {
    return false;
  }
  m->dev = makedev(major, minor);
  return absl::SimpleHexAtoi(ends.first, &m->start) && absl::SimpleHexAtoi(ends.second, &m->end);
}

// A descriptor this process holds on the file (`dev`, `inode`), opened read-write.
UniqueFd HeldDescriptor(dev_t dev, uint64_t inode) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return UniqueFd();
  UniqueFd found;
  while (dirent* e = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(e->d_name, &fd) || fd == dirfd(dir)) continue;
    struct stat st = {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_ino != inode || st.st_dev != dev) {
      continue;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) continue;
    // Reopened through /proc: a descriptor of our own, whoever closes theirs.
    found = UniqueFd(open(absl::StrCat("/proc/self/fd/", fd).c_str(), O_RDWR | O_CLOEXEC));
    if (found.valid()) break;
  }
  closedir(dir);
  return found;
}

// A connection to the agent's fd socket (server/local/fd_inbox.h), one request long.
absl::StatusOr<UniqueFd> ConnectFdSocket(const std::string& fd_socket) {
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (fd_socket.empty() || fd_socket.size() >= sizeof(addr.sun_path)) {
    return absl::UnavailableError(absl::StrCat("fd socket '", fd_socket, "' is not usable"));
  }
  std::memcpy(addr.sun_path, fd_socket.c_str(), fd_socket.size() + 1);
  UniqueFd sock(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return absl::ErrnoToStatus(errno, "socket(AF_UNIX)");
  // An agent that answers no more (stopping, stuck) is not waited for forever.
  timeval limit = {5, 0};
  setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  if (connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect(", fd_socket, "): ", strerror(errno)));
  }
  return sock;
}

// Reads exactly `n` bytes into `out`, and the descriptors that come with them into `fds`
// (MSG_CMSG_CLOEXEC: never inherited by a child). False when the connection ended first.
bool ReceiveExactly(int sock, char* out, size_t n, std::vector<UniqueFd>* fds) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = RecvWithFds(sock, out + got, n - got, 0, fds);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

uint64_t LittleEndian(const char* p, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

absl::StatusOr<SharedFile> FindSharedFile(const void* address, uint64_t length,
                                          const std::string& field) {
  const uint64_t start = reinterpret_cast<uint64_t>(address);
  if (length == 0) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    Mapping m;
    if (!ParseMapping(line, &m) || start < m.start || start >= m.end) continue;
    if (length > m.end - start) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": [", absl::Hex(start), ", +", length, ") spans more than one mapping; ",
          "register each shared allocation on its own"));
    }
    if (m.inode == 0 || m.perms.size() < 4 || m.perms[3] != 's') {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": the memory is private to this process (",
          m.inode == 0 ? "anonymous memory, e.g. malloc or a plain numpy array"
                       : "a MAP_PRIVATE file mapping",
          "), so the agent cannot map it; ", kHowToShare));
    }
    if (m.perms[0] != 'r' || m.perms[1] != 'w') {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": the mapping is not readable and writable (", m.perms, ")"));
    }
    SharedFile out;
    out.offset = m.offset + (start - m.start);
    out.fd = HeldDescriptor(m.dev, m.inode);
    const std::string deleted = " (deleted)";
    if (!out.fd.valid() && !m.path.empty() && m.path.front() == '/' &&
        (m.path.size() < deleted.size() ||
         m.path.compare(m.path.size() - deleted.size(), deleted.size(), deleted) != 0)) {
      out.fd = UniqueFd(open(m.path.c_str(), O_RDWR | O_CLOEXEC));
    }
    if (!out.fd.valid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": the memory is shared (", m.path, ") but this process holds no read-write "
          "descriptor for it, and it has no path to open; keep the memfd or shm descriptor "
          "open, or register the descriptor itself"));
    }
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", absl::Hex(start), " is not mapped in this process"));
}

absl::StatusOr<uint64_t> PassFd(const std::string& fd_socket, int fd) {
  ASSIGN_OR_RETURN(UniqueFd sock, ConnectFdSocket(fd_socket));
  static constexpr char kHello[] = "ferryfd1";
  if (SendWithFd(sock.get(), kHello, sizeof(kHello) - 1, fd, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof(kHello) - 1)) {
    return absl::UnavailableError(absl::StrCat("sendmsg(", fd_socket, "): ", strerror(errno)));
  }
  unsigned char answer[8];
  size_t got = 0;
  while (got < sizeof(answer)) {
    ssize_t n = recv(sock.get(), answer + got, sizeof(answer) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  uint64_t ticket = 0;
  for (size_t i = 0; i < got; ++i) ticket |= static_cast<uint64_t>(answer[i]) << (8 * i);
  if (got != sizeof(answer) || ticket == 0) {
    return absl::UnavailableError(
        absl::StrCat("the agent's fd socket ", fd_socket, " refused the descriptor"));
  }
  return ticket;
}

namespace {

absl::StatusOr<UniqueFd> BorrowOnce(const std::string& fd_socket, uint64_t buffer) {
  ASSIGN_OR_RETURN(UniqueFd sock, ConnectFdSocket(fd_socket));
  char request[16];
  std::memcpy(request, "ferrymap", 8);
  for (size_t i = 0; i < 8; ++i) request[8 + i] = static_cast<char>(buffer >> (8 * i));
  if (send(sock.get(), request, sizeof(request), MSG_NOSIGNAL) != sizeof(request)) {
    return absl::UnavailableError(absl::StrCat("send(", fd_socket, "): ", strerror(errno)));
  }
  std::vector<UniqueFd> fds;
  char head[8];
  if (!ReceiveExactly(sock.get(), head, sizeof(head), &fds)) {
    // ABORTED: tried again by BorrowBufferFile.
    return absl::AbortedError(absl::StrCat(
        "the agent's fd socket ", fd_socket, " ended without an answer for buffer ", buffer,
        " (busy with this uid's connections, an agent older than the lend request, or one "
        "stopping)"));
  }
  const auto code = static_cast<absl::StatusCode>(LittleEndian(head, 4));
  const uint64_t length = LittleEndian(head + 4, 4);
  std::string message(std::min<uint64_t>(length, 1024), '\0');
  if (!ReceiveExactly(sock.get(), message.data(), message.size(), &fds)) message.clear();
  if (code != absl::StatusCode::kOk) return absl::Status(code, message);
  if (fds.size() != 1) {
    return absl::UnavailableError(absl::StrCat("the agent's fd socket ", fd_socket, " sent ",
                                               fds.size(), " descriptors for buffer ", buffer));
  }
  return std::move(fds[0]);
}

}  // namespace

absl::StatusOr<UniqueFd> BorrowBufferFile(const std::string& fd_socket, uint64_t buffer) {
  // A connection closed unanswered: the agent had as many of this uid's connections waiting
  // as it keeps (server/local/fd_inbox.h). Borrowing is idempotent, so ask again, a little
  // later each time (about 1.3 s in all).
  absl::Status last;
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(10) * (1 << (attempt - 1)));
    absl::StatusOr<UniqueFd> file = BorrowOnce(fd_socket, buffer);
    if (file.ok() || !absl::IsAborted(file.status())) return file;
    last = file.status();
  }
  return absl::UnavailableError(last.message());
}

}  // namespace ferry
