#include "server/local/fd_inbox.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fd_passing.h"
#include "base/random_bytes.h"
#include "base/status_macros.h"
#include "server/local/unix_socket.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

constexpr size_t kHelloBytes = sizeof(FdInbox::kHello) - 1;
static_assert(sizeof(FdInbox::kLendHello) - 1 == kHelloBytes);
constexpr size_t kLendBytes = kHelloBytes + sizeof(uint64_t);

void PutLittleEndian(uint64_t value, size_t bytes, char* out) {
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<char>(value >> (8 * i));
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdInbox>> FdInbox::Start(const std::string& path, mode_t mode,
                                                        gid_t group) {
  ASSIGN_OR_RETURN(UniqueFd fd, ListenUnix(path, mode, group, "listen.local (fd socket)"));
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return absl::ErrnoToStatus(errno, "eventfd");
  std::unique_ptr<FdInbox> inbox(new FdInbox(path, std::move(fd), std::move(wake)));
  inbox->thread_ = std::thread([p = inbox.get()] { p->AcceptLoop(); });
  return inbox;
}

FdInbox::~FdInbox() {
  Stop();
  unlink(path_.c_str());
}

void FdInbox::Stop() {
  uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) < 0) {
    spdlog::warn("fd socket: waking the accept thread: {}", strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
}

void FdInbox::AcceptLoop() {
  std::vector<Pending> pending;
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({listener_.get(), POLLIN, 0});
    fds.push_back({wake_.get(), POLLIN, 0});
    absl::Time next = absl::InfiniteFuture();
    for (const Pending& p : pending) {
      fds.push_back({p.conn.get(), POLLIN, 0});
      next = std::min(next, p.until);
    }
    const int timeout_ms = next == absl::InfiniteFuture()
                               ? -1
                               : static_cast<int>(std::max<int64_t>(
                                     0, absl::ToInt64Milliseconds(next - absl::Now()) + 1));
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("fd socket: poll: {}; no more descriptors taken", strerror(errno));
      listener_ = UniqueFd();  // clients are refused at once rather than left waiting
      return;
    }
    if (fds[1].revents != 0) return;
    // Those that spoke (or hung up) are answered; those silent too long are closed.
    const absl::Time now = absl::Now();
    std::vector<Pending> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (fds[i + 2].revents != 0) {
        Receive(pending[i].conn.get(), pending[i].cred);
      } else if (now < pending[i].until) {
        still.push_back(std::move(pending[i]));
      }
    }
    pending = std::move(still);
    if (fds[0].revents != 0) AcceptAll(pending);
  }
}

void FdInbox::AcceptAll(std::vector<Pending>& pending) {
  while (true) {
    UniqueFd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        spdlog::warn("fd socket: accept: {}", strerror(errno));
        poll(nullptr, 0, 50);  // out of descriptors: they come back as others close
      }
      return;
    }
    ucred cred = {};
    socklen_t len = sizeof(cred);
    if (getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
    // A client whose message is here already waits for nothing: answered now, it takes no
    // slot (64 clients of one uid allocating at once each borrow a buffer's file, and the
    // per-uid cap on connections waiting to speak closed most of them unanswered).
    char peek;
    if (recv(conn.get(), &peek, 1, MSG_PEEK | MSG_DONTWAIT) == 1) {
      Receive(conn.get(), cred);
      continue;
    }
    const size_t of_uid =
        std::count_if(pending.begin(), pending.end(),
                      [&](const Pending& p) { return p.cred.uid == cred.uid; });
    if (pending.size() >= kMaxPending || of_uid >= kMaxPendingPerUid) {
      spdlog::warn("fd socket: uid {} has {} connections waiting to send ({} in all): closed "
                   "one more",
                   cred.uid, of_uid, pending.size());
      continue;  // closed without a ticket: the client sees the connection end
    }
    pending.push_back({std::move(conn), cred, absl::Now() + kReceiveTimeout});
  }
}

void FdInbox::Receive(int conn, const ucred& cred) {
  char data[kLendBytes + 1] = {};
  // Every descriptor that came is owned here, so that a malformed message leaks none.
  std::vector<UniqueFd> fds;
  bool truncated = false;
  ssize_t n = RecvWithFds(conn, data, sizeof(data), MSG_DONTWAIT, &fds, &truncated);
  const bool whole = !truncated;
  if (whole && n == static_cast<ssize_t>(kLendBytes) &&
      std::memcmp(data, kLendHello, kHelloBytes) == 0 && fds.empty()) {
    uint64_t id = 0;
    for (size_t i = 0; i < sizeof(id); ++i) {
      id |= static_cast<uint64_t>(static_cast<unsigned char>(data[kHelloBytes + i])) << (8 * i);
    }
    Lend(conn, id, cred);
    return;
  }
  if (!whole || n != static_cast<ssize_t>(kHelloBytes) ||
      std::memcmp(data, kHello, kHelloBytes) != 0 || fds.size() != 1) {
    spdlog::debug("fd socket: malformed message from pid {} (uid {}): {} bytes, {} descriptors",
                  cred.pid, cred.uid, n, fds.size());
    return;
  }
  uint64_t ticket = Hold(std::move(fds[0]), cred.uid);
  char answer[sizeof(ticket)];
  PutLittleEndian(ticket, sizeof(ticket), answer);
  if (send(conn, answer, sizeof(answer), MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof(answer)) {
    spdlog::debug("fd socket: answering pid {}: {}", cred.pid, strerror(errno));
  }
}

void FdInbox::Lend(int conn, uint64_t id, const ucred& cred) {
  Lender lender;
  {
    absl::MutexLock lock(&mu_);
    lender = lender_;
  }
  absl::StatusOr<UniqueFd> file =
      lender ? lender(id, cred)
             : absl::UnimplementedError("fd socket: this agent lends no buffer files");
  const absl::Status status = file.status();
  const std::string message(status.message().substr(0, kMaxLendMessage));
  std::string answer(8, '\0');
  PutLittleEndian(static_cast<uint32_t>(status.code()), 4, answer.data());
  PutLittleEndian(message.size(), 4, answer.data() + 4);
  answer += message;
  // The answer fits the socket's empty send buffer: it never waits. Our copy of the
  // descriptor closes when `file` goes; the client's stays.
  if (SendWithFd(conn, answer.data(), answer.size(), file.ok() ? file->get() : -1,
                 MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(answer.size())) {
    spdlog::debug("fd socket: lending buffer {} to pid {}: {}", id, cred.pid, strerror(errno));
  }
}

uint64_t FdInbox::Hold(UniqueFd fd, uid_t uid) {
  absl::StatusOr<uint64_t> ticket = RandomValue<uint64_t>();
  if (!ticket.ok() || *ticket == 0) return 0;
  absl::MutexLock lock(&mu_);
  DropExpiredLocked();
  size_t of_uid = 0;
  for (const auto& [ticket, held] : held_) of_uid += held.uid == uid;
  if (held_.size() >= kMaxHeld || of_uid >= kMaxHeldPerUid) {
    spdlog::warn("fd socket: {} descriptors ({} of uid {}) wait for RegisterMemory already; "
                 "refusing another",
                 held_.size(), of_uid, uid);
    return 0;
  }
  held_.emplace(*ticket, Held{std::move(fd), uid, absl::Now() + kTicketTtl});
  return *ticket;
}

absl::StatusOr<UniqueFd> FdInbox::Take(uint64_t ticket, uid_t uid) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(ticket);
  if (it == held_.end() || it->second.expires <= absl::Now()) {
    if (it != held_.end()) held_.erase(it);
    return absl::NotFoundError(absl::StrCat(
        "fd_ticket: ", ticket, " is unknown or expired (a ticket is good for one "
        "registration, within ", absl::FormatDuration(kTicketTtl), " of passing the descriptor)"));
  }
  if (it->second.uid != uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "fd_ticket: the descriptor was passed by uid ", it->second.uid, ", not uid ", uid));
  }
  UniqueFd fd = std::move(it->second.fd);
  held_.erase(it);
  return fd;
}

void FdInbox::DropExpiredLocked() {
  const absl::Time now = absl::Now();
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.expires <= now) {
      held_.erase(it++);
    } else {
      ++it;
    }
  }
}

size_t FdInbox::held() {
  absl::MutexLock lock(&mu_);
  DropExpiredLocked();
  return held_.size();
}

}  // namespace ferry::server
