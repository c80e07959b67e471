#include "server/local/fd_inbox.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/random_bytes.h"
#include "base/status_macros.h"
#include "server/local/unix_socket.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

constexpr size_t kHelloBytes = sizeof(FdInbox::kHello) - 1;
// How long one connection may take to send its message: the accept thread reads it, so a
// client that connects and says nothing holds up the next one this long at most.
constexpr int kReceiveTimeoutMs = 1000;

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
  while (true) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("fd socket: poll: {}; no more descriptors taken", strerror(errno));
      listener_ = UniqueFd();  // clients are refused at once rather than left waiting
      return;
    }
    if (fds[1].revents != 0) return;
    UniqueFd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      spdlog::warn("fd socket: accept: {}", strerror(errno));
      poll(nullptr, 0, 50);
      continue;
    }
    Receive(conn.get());
  }
}

void FdInbox::Receive(int conn) {
  ucred cred = {};
  socklen_t len = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
  pollfd p = {conn, POLLIN, 0};
  if (poll(&p, 1, kReceiveTimeoutMs) <= 0) return;
  char data[kHelloBytes + 1] = {};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  iovec iov = {data, sizeof(data)};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  // MSG_CMSG_CLOEXEC: a descriptor received is never inherited by a child of the agent.
  ssize_t n = recvmsg(conn, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  // Every descriptor that came is owned here, so that a malformed message leaks none.
  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  if (n != static_cast<ssize_t>(kHelloBytes) || std::memcmp(data, kHello, kHelloBytes) != 0 ||
      (msg.msg_flags & MSG_CTRUNC) != 0 || fds.size() != 1) {
    spdlog::debug("fd socket: malformed message from pid {} (uid {}): {} bytes, {} descriptors",
                  cred.pid, cred.uid, n, fds.size());
    return;
  }
  uint64_t ticket = Hold(std::move(fds[0]), cred.uid);
  char answer[sizeof(ticket)];
  for (size_t i = 0; i < sizeof(ticket); ++i) answer[i] = static_cast<char>(ticket >> (8 * i));
  if (send(conn, answer, sizeof(answer), MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof(answer)) {
    spdlog::debug("fd socket: answering pid {}: {}", cred.pid, strerror(errno));
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
