#include "client/socket_line.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/frame.h"
#include "base/status_macros.h"
#include "client/answer_turns.h"
#include "google/protobuf/arena.h"

namespace ferry {
namespace {

constexpr size_t kReadBytes = 64 << 10;

// poll()'s timeout for `deadline`: whole milliseconds, rounded up so that a wait never
// ends just before its deadline.
int PollMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// How long a connect waits for the agent to accept it: past that the agent is too busy (or
// stopped) to be worth the socket, and gRPC carries the client's transfers for a while.
constexpr absl::Duration kAcceptWait = absl::Seconds(2);
// The longest refusal the agent answers a hello with (a status message).
constexpr uint32_t kMaxRefusalBytes = 64 << 10;

// Reads the agent's answer to kTransferSocketHelloAcked by `deadline`: OK for
// kTransferSocketAccepted, else the refusal it sent (RESOURCE_EXHAUSTED: too many
// connections), or why there was none.
absl::Status AwaitAccepted(int fd, absl::Time deadline) {
  std::string in;
  char buf[512];
  while (true) {
    std::optional<uint32_t> length = FrameLength(in);
    if (length && *length <= kMaxRefusalBytes) {  // a refusal ("ferr" reads as far more)
      if (in.size() >= kFrameHeaderBytes + *length) {
        ferry::v1::StreamedResults results;
        if (!results.ParseFromArray(in.data() + kFrameHeaderBytes, static_cast<int>(*length)) ||
            results.results_size() != 1 || results.results(0).code() == 0) {
          return absl::InternalError(
              "transfer socket: the agent answered the hello with neither \"ferryok1\" nor a "
              "refusal");
        }
        return absl::Status(static_cast<absl::StatusCode>(results.results(0).code()),
                            results.results(0).message());
      }
    } else if (in.size() >= kTransferSocketHelloBytes) {
      if (in != absl::string_view(kTransferSocketAccepted, kTransferSocketHelloBytes)) {
        return absl::InternalError(
            "transfer socket: the agent answered the hello with neither \"ferryok1\" nor a "
            "refusal");
      }
      return absl::OkStatus();
    }
    pollfd p = {fd, POLLIN, 0};
    const int ready = poll(&p, 1, PollMs(deadline));
    if (ready == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("transfer socket: the agent did not accept the connection within ",
                       absl::FormatDuration(kAcceptWait)));
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, "transfer socket: poll(hello)");
    }
    // Nothing follows the answer: no request has gone yet.
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) {
      return absl::UnavailableError("transfer socket: the agent closed the connection at hello");
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, "transfer socket: recv(hello)");
    }
    in.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

absl::StatusOr<UniqueFd> ConnectTransferSocket(const std::string& path) {
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer socket: '", path, "' is not a Unix socket path"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return absl::ErrnoToStatus(errno, "transfer socket: socket");
  // A Unix socket connects at once or not at all (EAGAIN: the agent's backlog is full).
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("transfer socket: connect(", path, ")"));
  }
  // A new connection's send buffer is empty: the hello goes whole or the socket is broken.
  const ssize_t n =
      send(fd.get(), kTransferSocketHelloAcked, kTransferSocketHelloBytes, MSG_NOSIGNAL);
  if (n != static_cast<ssize_t>(kTransferSocketHelloBytes)) {
    return absl::ErrnoToStatus(n < 0 ? errno : EAGAIN, "transfer socket: send(hello)");
  }
  RETURN_IF_ERROR(AwaitAccepted(fd.get(), absl::Now() + kAcceptWait));
  return fd;
}

absl::StatusOr<std::unique_ptr<SocketLine>> SocketLine::Connect(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, ConnectTransferSocket(path));
  return std::unique_ptr<SocketLine>(new SocketLine(std::move(fd)));
}

bool SocketLine::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

SocketLine::Outcome SocketLine::Run(const std::vector<OpSpec>& ops, absl::Duration timeout,
                                    bool include_ops, absl::Duration wait) {
  google::protobuf::Arena arena;
  auto* request = google::protobuf::Arena::CreateMessage<ferry::v1::SocketRequest>(&arena);
  FillSubmitRequest(ops, timeout, request->mutable_transfer()->mutable_submit());
  request->mutable_transfer()->set_include_ops(include_ops);
  return TransferOutcome(Exchange(*request, wait, "the transfer's timeout and 5 s"));
}

SocketLine::Outcome SocketLine::Move(uint64_t session, const ferry::v1::MoveBlocksRequest& move,
                                     absl::Duration wait) {
  google::protobuf::Arena arena;
  auto* request = google::protobuf::Arena::CreateMessage<ferry::v1::SocketRequest>(&arena);
  request->mutable_move()->set_session(session);
  *request->mutable_move()->mutable_request() = move;
  return TransferOutcome(Exchange(*request, wait, "the move's timeout and 10 s"));
}

SocketLine::Polled SocketLine::Poll(const ferry::v1::PollNotificationsRequest& poll,
                                    absl::Duration wait) {
  ferry::v1::SocketRequest request;
  *request.mutable_poll() = poll;
  Exchanged exchanged = Exchange(request, wait, "a poll's wait");
  if (!exchanged.answer.ok()) return {exchanged.answer.status(), exchanged.sent};
  return {std::move(*exchanged.answer->mutable_poll()), exchanged.sent};
}

SocketLine::Outcome SocketLine::TransferOutcome(Exchanged exchanged) {
  if (!exchanged.answer.ok()) return {exchanged.answer.status(), exchanged.sent};
  return {std::move(*exchanged.answer->mutable_result()), exchanged.sent};
}

SocketLine::Exchanged SocketLine::Exchange(ferry::v1::SocketRequest& request,
                                           absl::Duration wait, absl::string_view wait_is) {
  const absl::Time deadline = absl::Now() + wait;
  Answer answer;
  uint64_t tag = 0;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) {
      return {absl::UnavailableError("the transfer socket's connection has ended"), false};
    }
    tag = next_tag_++;
    waiters_[tag] = &answer;  // before it goes: the answer may come before the write returns
  }
  request.set_tag(tag);
  const size_t size = request.ByteSizeLong();
  std::string frame;
  frame.reserve(kFrameHeaderBytes + size);
  AppendFrameHeader(static_cast<uint32_t>(size), &frame);
  request.AppendToString(&frame);
  size_t written = 0;
  absl::Status sent = WriteFrame(frame, deadline, &written);

  absl::MutexLock lock(&mu_);
  if (!sent.ok()) {
    waiters_.erase(tag);
    // The socket broke, or part of a frame is on it (whatever followed would be misread):
    // this connection is done. A request that found no room by its deadline leaves it as is.
    if (written > 0 || !absl::IsDeadlineExceeded(sent)) EndLocked(sent);
    return {sent, false};
  }
  AwaitAnswer(mu_, reading_, answer, deadline,
              [this](absl::Time until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                return ReadLocked(until);
              });
  if (!answer.has_value()) {
    waiters_.erase(tag);  // an answer that comes later is dropped
    return {absl::DeadlineExceededError(absl::StrCat("no answer from the agent within ",
                                                     absl::FormatDuration(wait), " (", wait_is,
                                                     ")")),
            true};
  }
  return {*std::move(answer), true};
}

absl::Status SocketLine::WriteFrame(const std::string& frame, absl::Time deadline,
                                    size_t* written) {
  absl::MutexLock lock(&write_mu_);
  while (*written < frame.size()) {
    const ssize_t n = send(fd_.get(), frame.data() + *written, frame.size() - *written,
                           MSG_NOSIGNAL);
    if (n > 0) {
      *written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      // The agent reads no more for now (its window is full): wait for room.
      pollfd p = {fd_.get(), POLLOUT, 0};
      const int ready = poll(&p, 1, PollMs(deadline));
      if (ready == 0) {
        return absl::DeadlineExceededError(
            "transfer socket: the agent took no request by the deadline");
      }
      if (ready < 0 && errno != EINTR) return absl::ErrnoToStatus(errno, "transfer socket: poll");
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("transfer socket: send: ", strerror(errno), " (the agent went away)"));
  }
  return absl::OkStatus();
}

bool SocketLine::ReadLocked(absl::Time deadline) {
  if (ended_) return true;  // EndLocked answered every waiter
  reading_ = true;
  mu_.Unlock();
  // Room for what the frame at the head still needs, or kReadBytes.
  if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  size_t need = kReadBytes;
  const size_t have = in_end_ - in_begin_;
  std::optional<uint32_t> length =
      FrameLength(absl::string_view(in_.data() + in_begin_, have));
  if (length && *length <= kMaxFrameBytes && kFrameHeaderBytes + *length > have) {
    need = std::max(need, kFrameHeaderBytes + *length - have);
  }
  if (in_.size() - in_end_ < need) {
    if (have > 0) std::memmove(in_.data(), in_.data() + in_begin_, have);
    in_begin_ = 0;
    in_end_ = have;
    if (in_.size() - in_end_ < need) in_.resize(in_end_ + need);
  }
  pollfd p = {fd_.get(), POLLIN, 0};
  const int ready = poll(&p, 1, PollMs(deadline));
  ssize_t n = -1;
  int error = EAGAIN;
  if (ready > 0) {
    n = recv(fd_.get(), in_.data() + in_end_, in_.size() - in_end_, MSG_DONTWAIT);
    error = errno;
  } else if (ready < 0) {
    error = errno;
  }
  mu_.Lock();
  reading_ = false;
  if (n > 0) {
    in_end_ += static_cast<size_t>(n);
    DeliverLocked();
    return true;
  }
  if (n == 0) {
    EndLocked(absl::UnavailableError("the agent closed the transfer socket before the answer"));
    return true;
  }
  if (error == EAGAIN || error == EINTR) return absl::Now() < deadline;
  EndLocked(absl::UnavailableError(
      absl::StrCat("transfer socket: recv: ", strerror(error), " (before the answer)")));
  return true;
}

void SocketLine::DeliverLocked() {
  while (true) {
    const absl::string_view in(in_.data() + in_begin_, in_end_ - in_begin_);
    std::optional<uint32_t> length = FrameLength(in);
    if (!length) return;
    if (*length > kMaxFrameBytes) {
      EndLocked(absl::InternalError(absl::StrCat("transfer socket: the agent sent a frame of ",
                                                 *length, " bytes")));
      return;
    }
    if (in.size() < kFrameHeaderBytes + *length) return;
    ferry::v1::SocketAnswers results;
    const bool parsed =
        results.ParseFromArray(in.data() + kFrameHeaderBytes, static_cast<int>(*length));
    in_begin_ += kFrameHeaderBytes + *length;
    if (!parsed) {
      EndLocked(absl::InternalError("transfer socket: the agent sent a frame that is not a "
                                    "ferry.v1.SocketAnswers"));
      return;
    }
    for (ferry::v1::SocketAnswer& r : *results.mutable_results()) {
      if (r.tag() == 0) {  // the agent refused the connection, and closes it
        EndLocked(absl::Status(static_cast<absl::StatusCode>(r.code()), r.message()));
        return;
      }
      auto it = waiters_.find(r.tag());
      if (it == waiters_.end()) continue;  // its caller gave up waiting
      Answer* waiter = it->second;
      waiters_.erase(it);
      if (r.code() != 0) {
        *waiter = absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
      } else {
        *waiter = std::move(r);
      }
    }
  }
}

void SocketLine::EndLocked(const absl::Status& why) {
  ended_ = true;
  for (auto& [tag, waiter] : waiters_) *waiter = why;
  waiters_.clear();
  shutdown(fd_.get(), SHUT_RDWR);
}

}  // namespace ferry
