#include "server/api/transfer_socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/frame.h"
#include "base/status_macros.h"
#include "server/local/unix_socket.h"
#include "server/api/request_arena.h"
#include "server/api/transfer_stream.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

using Request = ferry::v1::SocketRequest;
using Answer = ferry::v1::SocketAnswer;

constexpr size_t kHelloBytes = kTransferSocketHelloBytes;
// Bytes taken from one connection per turn, at most.
constexpr size_t kReadBytes = 256 << 10;
// A buffer grown past this for one large message goes back once it is empty.
constexpr size_t kKeptBufferBytes = 1 << 20;

void Wake(const UniqueFd& wake) {
  uint64_t one = 1;
  // Fails only when the counter would overflow, and the thread reads it at every wake-up.
  (void)!write(wake.get(), &one, sizeof(one));
}

Answer Refusal(uint64_t tag, const absl::Status& why) {
  Answer answer;
  answer.set_tag(tag);
  answer.set_code(static_cast<int>(why.code()));
  answer.set_message(std::string(why.message()));
  return answer;
}

// A connection past the limits: one refusal (tag 0, RESOURCE_EXHAUSTED), written before its
// hello is read (a new socket's buffer takes it whole), then closed. libferry's connect
// reads it in place of kTransferSocketAccepted and uses gRPC instead.
void RefuseAtAccept(const UniqueFd& conn, const std::string& why) {
  spdlog::warn("{}; one more refused", why);
  ferry::v1::SocketAnswers results;
  *results.add_results() =
      Refusal(0, absl::ResourceExhaustedError(absl::StrCat(why, "; use the gRPC API")));
  std::string frame;
  AppendFrameHeader(static_cast<uint32_t>(results.ByteSizeLong()), &frame);
  results.AppendToString(&frame);
  // A client already gone makes this fail; it reads nothing then either.
  (void)!send(conn.get(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

// One client's connection. The socket thread reads it and starts its requests; any thread
// that ends one of its transfers writes the answer (under mu_, non-blocking: what the socket
// does not take now is left to the socket thread, woken for it). Running transfers hold it
// through their answers, so it may outlive its place in the loop and the socket itself.
class TransferSocket::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(UniqueFd fd, uid_t uid, Calls calls, WorkerPool* starters,
             std::shared_ptr<const UniqueFd> wake, std::shared_ptr<UidBuffered> buffered)
      : fd_(std::move(fd)),
        uid_(uid),
        calls_(std::move(calls)),
        starters_(starters),
        wake_(std::move(wake)),
        buffered_(std::move(buffered)) {}
  // What its buffer held is the uid's no more.
  ~Connection() { buffered_->fetch_sub(charged_); }

  uid_t uid() const { return uid_; }

  // The socket thread only, from here to Close.
  int fd() const { return fd_.get(); }
  // What poll() should wait for: POLLIN while it may take requests, POLLOUT while answers
  // wait unsent.
  short Events() {
    absl::MutexLock lock(&mu_);
    short events = 0;
    if (!PausedLocked() && !eof_) events |= POLLIN;
    if (out_sent_ < out_.size()) events |= POLLOUT;
    return events;
  }
  // A whole request (or what refuses the connection) is read already and may start now:
  // the thread must not sleep in poll().
  bool Ready() {
    {
      absl::MutexLock lock(&mu_);
      if (PausedLocked() || broken_) return broken_;
    }
    const absl::string_view in = Unread();
    if (!hello_) return in.size() >= kHelloBytes;
    return WholeFrameUnread();
  }
  // Writes, reads and starts what poll() reported and what was read; false when the
  // connection is over (the client closed it, it broke, or it was refused; or the client
  // ended its writing and every request it sent is answered).
  bool Serve(short revents) {
    bool eof;
    {
      absl::MutexLock lock(&mu_);
      if (revents & POLLOUT) FlushLocked();
      if (broken_) return false;
      // POLLHUP: the client closed both ways (a Unix socket's peer gone, unix_poll); it
      // reads no answer, and what it sent and we did not start is dropped.
      if (PausedLocked()) return (revents & (POLLHUP | POLLERR)) == 0;
      eof = eof_;
    }
    if ((revents & (POLLIN | POLLHUP | POLLERR)) && !eof) {
      if (!ReadSome()) return false;
    }
    if (!StartRequests()) return false;
    absl::MutexLock lock(&mu_);
    if (!eof_) return true;
    if (revents & (POLLHUP | POLLERR)) return false;
    // The client ended its writing only: open until the last answer is written (a part of a
    // request it never finished is dropped).
    return open_ > 0 || starting_ || !out_.empty() || WholeFrameUnread();
  }
  // Closes the socket: answers of transfers still running go nowhere.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    fd_ = UniqueFd();
    out_.clear();
  }

  // Any thread: `answer` to the client, and the request it answers is over (if `counted`).
  void Send(Answer answer, bool counted) {
    ferry::v1::SocketAnswers results;
    results.mutable_results()->Add(std::move(answer));
    const size_t size = results.ByteSizeLong();
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    const bool was_paused = PausedLocked();
    if (counted) --open_;
    const size_t at = out_.size();
    AppendFrameHeader(static_cast<uint32_t>(size), &out_);
    out_.resize(at + kFrameHeaderBytes + size);
    results.SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(out_.data() + at + kFrameHeaderBytes));
    FlushLocked();
    // A lone answer written whole wakes nobody: the answer's own thread did all of it. The
    // last one after the client's end of writing wakes the thread to close the connection.
    if (broken_ || out_sent_ < out_.size() || (was_paused && !PausedLocked()) ||
        (eof_ && open_ == 0)) {
      Wake(*wake_);
    }
  }

 private:
  absl::string_view Unread() const {
    return absl::string_view(in_.data() + in_begin_, in_end_ - in_begin_);
  }
  // A whole frame, or the header of one too long to take, is read and not started.
  bool WholeFrameUnread() const {
    const absl::string_view in = Unread();
    std::optional<uint32_t> length = FrameLength(in);
    return length && (*length > kMaxFrameBytes || in.size() >= kFrameHeaderBytes + *length);
  }

  // Reads once what the socket has, up to kReadBytes (more when the message being read
  // needs it, but never more than twice what came of it: memory follows the bytes sent, not
  // the length a header claims), and nothing while kReadBytes wait unstarted. False at the
  // end of the connection.
  bool ReadSome() {
    if (in_begin_ == in_end_) {
      in_begin_ = in_end_ = 0;
      if (in_.size() > kKeptBufferBytes) {
        std::vector<char>().swap(in_);
        Charge();
      }
    }
    const size_t have = in_end_ - in_begin_;
    std::optional<uint32_t> length = FrameLength(Unread());
    const bool partial = length && hello_ && kFrameHeaderBytes + *length > have;
    // kReadBytes read ahead and not started yet: no more until they are.
    if (have >= kReadBytes && !partial) return true;
    size_t need = kReadBytes;
    if (partial) need = std::max(need, std::min<size_t>(kFrameHeaderBytes + *length - have, have));
    if (in_.size() - in_end_ < need) {
      if (have > 0) std::memmove(in_.data(), in_.data() + in_begin_, have);
      in_end_ -= in_begin_;
      in_begin_ = 0;
      if (in_.size() - in_end_ < need) {
        // One uid's connections together hold at most kMaxBufferedBytesPerUid of requests
        // not yet started (128 connections each holding most of a 64 MiB frame held 8 GB).
        const size_t grow = in_end_ + need - in_.size();
        const size_t held = buffered_->load();
        if (held + grow > kMaxBufferedBytesPerUid) {
          spdlog::warn("transfer socket: uid {} holds {} bytes of requests not yet started, "
                       "{} more asked; connection closed", uid_, held, grow);
          Send(Refusal(0, absl::ResourceExhaustedError(absl::StrCat(
                              "transfer socket: uid ", uid_, "'s connections hold ", held,
                              " bytes of requests not yet started, and this one needs ", grow,
                              " more; at most ", kMaxBufferedBytesPerUid,
                              " a uid (send smaller requests, or fewer at once)"))),
               /*counted=*/false);
          return false;
        }
        in_.resize(in_end_ + need);
        Charge();
      }
    }
    const ssize_t n = recv(fd_.get(), in_.data() + in_end_, need, MSG_DONTWAIT);
    if (n > 0) {
      in_end_ += static_cast<size_t>(n);
      return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n < 0) return false;  // the socket broke
    // The client's end of writing (shutdown(SHUT_WR), or close): what it sent is answered.
    absl::MutexLock lock(&mu_);
    eof_ = true;
    return true;
  }

  // Starts up to kRoundFrames whole requests read so far; false when the connection was
  // refused (an answer of tag 0 says why).
  bool StartRequests() {
    if (!hello_) {
      const absl::string_view in = Unread();
      if (in.size() < kHelloBytes) return true;
      const absl::string_view hello = in.substr(0, kHelloBytes);
      const bool acked = hello == absl::string_view(kTransferSocketHelloAcked, kHelloBytes);
      if (!acked && hello != absl::string_view(kTransferSocketHello, kHelloBytes)) {
        return Refuse(absl::StrCat("transfer socket: a connection begins with \"",
                                   kTransferSocketHello, "\" or \"", kTransferSocketHelloAcked,
                                   "\"; this is not a ferry transfer client"));
      }
      in_begin_ += kHelloBytes;
      hello_ = true;
      if (acked) {  // the client waits to hear that it may use the connection
        absl::MutexLock lock(&mu_);
        out_.append(kTransferSocketAccepted, kHelloBytes);
        FlushLocked();  // what the socket does not take now, poll() asks POLLOUT for
      }
    }
    for (size_t i = 0; i < kRoundFrames; ++i) {
      {
        absl::MutexLock lock(&mu_);
        if (PausedLocked()) return true;
      }
      const absl::string_view in = Unread();
      std::optional<uint32_t> length = FrameLength(in);
      if (!length) return true;
      if (*length > kMaxFrameBytes) {
        return Refuse(absl::StrCat("transfer socket: message ", frames_ + 1, " is ", *length,
                                   " bytes; at most ", kMaxFrameBytes));
      }
      if (in.size() < kFrameHeaderBytes + *length) return true;
      auto* request = google::protobuf::Arena::CreateMessage<Request>(arena_.arena());
      if (!request->ParseFromArray(in.data() + kFrameHeaderBytes, static_cast<int>(*length))) {
        return Refuse(absl::StrCat("transfer socket: message ", frames_ + 1, " (", *length,
                                   " bytes) is not a ferry.v1.SocketRequest"));
      }
      in_begin_ += kFrameHeaderBytes + *length;
      ++frames_;
      // A peer must resolve a buffer (a blocking call), or a batch takes long to plan: on a
      // starter, and this connection's next request waits for it, so requests start in the
      // order sent while the thread serves the other connections.
      const std::optional<std::string> lane = StarterLane(*request);
      {
        absl::MutexLock lock(&mu_);
        ++open_;  // counted before it starts: its answer may come first
        starting_ = lane.has_value();
      }
      if (!lane) {
        Start(*request);
        continue;
      }
      starters_->Run(*lane, [self = shared_from_this(), request] {
        {
          absl::MutexLock lock(&self->mu_);
          if (self->closed_) return;  // nobody to answer: start nothing
        }
        self->Start(*request);
        absl::MutexLock lock(&self->mu_);
        self->starting_ = false;
        Wake(*self->wake_);
      });
      return true;
    }
    return true;
  }

  // The starter lane `request` starts in: the peer it may ask something, or "" when it is
  // only long to plan; nullopt: it starts on this thread.
  std::optional<std::string> StarterLane(const Request& request) const {
    std::optional<std::string> peer;
    bool large = false;
    if (request.has_poll()) {
      return std::nullopt;  // it never blocks: answered at once, here
    } else if (request.has_move()) {
      large = request.move().request().local_blocks_size() > kInlineOps;
      if (calls_.moves) peer = calls_.moves->MayBlockOn(request.move());
    } else {
      large = request.transfer().submit().ops_size() > kInlineOps;
      peer = calls_.transfers->MayBlockOn(request.transfer());
    }
    if (!peer && large) peer = "";
    return peer;
  }

  // Starts `request` (read into arena_, which it empties).
  void Start(const Request& request) {
    const uint64_t tag = request.tag();
    auto answer = [self = shared_from_this(), tag](ferry::v1::TransferResult result) {
      Answer answer;
      answer.set_tag(tag);
      *answer.mutable_result() = std::move(result);
      self->Send(std::move(answer), /*counted=*/true);
    };
    absl::StatusOr<uint64_t> started;
    if (request.has_move() + request.has_transfer() + request.has_poll() > 1) {
      started = absl::InvalidArgumentError(
          "move: a request on the transfer socket is a transfer, a move or a poll, only one");
    } else if (request.has_poll() && !calls_.polls) {
      started = absl::UnimplementedError("poll: this transfer socket answers no polls");
    } else if (request.has_poll()) {
      Answer polled;
      polled.set_tag(tag);
      *polled.mutable_poll() = calls_.polls->Poll(request.poll());
      Send(std::move(polled), /*counted=*/true);
      arena_.Reset();
      return;
    } else if (request.has_move() && !calls_.moves) {
      started = absl::UnimplementedError("move: this transfer socket moves no blocks");
    } else if (request.has_move()) {
      started = calls_.moves->Start(request.move(), std::move(answer));
    } else {
      started = calls_.transfers->Start(request.transfer(), std::move(answer));
    }
    if (!started.ok()) Send(Refusal(tag, started.status()), /*counted=*/true);
    // The engine took what it needs from the request (Submit copies, holds no reference;
    // a move's hooks copy the names they need).
    arena_.Reset();
  }

  bool Refuse(const std::string& why) {
    spdlog::warn("{}; connection closed", why);
    Send(Refusal(0, absl::InvalidArgumentError(why)), /*counted=*/false);
    return false;
  }

  bool PausedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return starting_ || open_ >= kStreamWindow || out_.size() - out_sent_ >= kMaxUnsentBytes;
  }

  // Writes what the socket takes now, without blocking.
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (out_sent_ < out_.size() && !broken_) {
      const ssize_t n = send(fd_.get(), out_.data() + out_sent_, out_.size() - out_sent_,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        out_sent_ += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        return;
      } else {
        broken_ = true;  // the client went away: the socket thread closes it
      }
    }
    out_.clear();
    out_sent_ = 0;
    if (out_.capacity() > kKeptBufferBytes) out_.shrink_to_fit();
  }

  // Counts in_'s size against the uid's buffered bytes (the socket thread's).
  void Charge() {
    if (in_.size() >= charged_) {
      buffered_->fetch_add(in_.size() - charged_);
    } else {
      buffered_->fetch_sub(charged_ - in_.size());
    }
    charged_ = in_.size();
  }

  // Written under mu_ only by the socket thread (Close), read there without it and by
  // answers under it.
  UniqueFd fd_;
  const uid_t uid_;  // the kernel's (SO_PEERCRED), for the per-uid limit
  const Calls calls_;
  WorkerPool* const starters_;
  const std::shared_ptr<const UniqueFd> wake_;
  const std::shared_ptr<UidBuffered> buffered_;  // its uid's connections' in_ bytes
  size_t charged_ = 0;                           // in_.size() counted there

  // What was read and not yet started: in_[in_begin_, in_end_). The socket thread's, and a
  // starter's while starting_ (the thread takes nothing then).
  std::vector<char> in_;
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  bool hello_ = false;
  uint64_t frames_ = 0;  // requests read, for messages
  RequestArena arena_;   // the request being started

  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;    // a write failed: the client is gone
  bool eof_ ABSL_GUARDED_BY(mu_) = false;       // the client ended its writing
  bool starting_ ABSL_GUARDED_BY(mu_) = false;  // a request is on a starter
  size_t open_ ABSL_GUARDED_BY(mu_) = 0;        // requests read and not yet answered
  std::string out_ ABSL_GUARDED_BY(mu_);        // answers, framed; out_[0, out_sent_) written
  size_t out_sent_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::StatusOr<std::unique_ptr<TransferSocket>> TransferSocket::Start(const std::string& path,
                                                                      mode_t mode, gid_t group,
                                                                      WorkerPool* starters,
                                                                      CallsFor calls_for) {
  ASSIGN_OR_RETURN(UniqueFd listener,
                   ListenUnix(path, mode, group, "listen.local (transfer socket)"));
  auto wake = std::make_shared<const UniqueFd>(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake->valid()) return absl::ErrnoToStatus(errno, "eventfd");
  std::unique_ptr<TransferSocket> socket(new TransferSocket(
      path, std::move(listener), std::move(wake), starters, std::move(calls_for)));
  socket->thread_ = std::thread([s = socket.get()] { s->Loop(); });
  return socket;
}

TransferSocket::~TransferSocket() {
  Stop();
  unlink(path_.c_str());
}

void TransferSocket::Stop() {
  stopping_.store(true);
  Wake(*wake_);
  if (thread_.joinable()) thread_.join();
}

void TransferSocket::Loop() {
  std::vector<std::shared_ptr<Connection>> open;
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    fds.clear();
    fds.push_back({wake_->get(), POLLIN, 0});
    fds.push_back({listener_.get(), POLLIN, 0});
    bool ready = false;
    for (const std::shared_ptr<Connection>& c : open) {
      fds.push_back({c->fd(), c->Events(), 0});
      ready = ready || c->Ready();
    }
    if (poll(fds.data(), fds.size(), ready ? 0 : -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("transfer socket: poll: {}; it takes no more transfers", strerror(errno));
      break;
    }
    if (fds[0].revents != 0) {
      uint64_t count = 0;
      (void)!read(wake_->get(), &count, sizeof(count));
    }
    if (stopping_.load()) break;
    const size_t polled = open.size();
    for (size_t i = 0; i < polled; ++i) {
      if (!open[i]->Serve(fds[i + 2].revents)) {
        open[i]->Close();
        open[i] = nullptr;
      }
    }
    open.erase(std::remove(open.begin(), open.end(), nullptr), open.end());
    if (fds[1].revents != 0) Accept(open);
    connections_.store(open.size(), std::memory_order_relaxed);
  }
  for (const std::shared_ptr<Connection>& c : open) c->Close();
  connections_.store(0, std::memory_order_relaxed);
}

void TransferSocket::Accept(std::vector<std::shared_ptr<Connection>>& open) {
  while (true) {
    UniqueFd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != ECONNABORTED) {
        // Out of fds: they come back as connections close; meanwhile do not spin on it.
        spdlog::warn("transfer socket: accept: {}", strerror(errno));
        poll(nullptr, 0, 50);
      }
      return;
    }
    ucred cred = {};
    socklen_t len = sizeof(cred);
    if (getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      spdlog::warn("transfer socket: getsockopt(SO_PEERCRED): {}; connection closed",
                   strerror(errno));
      continue;
    }
    const size_t of_uid = std::count_if(
        open.begin(), open.end(),
        [&](const std::shared_ptr<Connection>& c) { return c->uid() == cred.uid; });
    if (open.size() >= kMaxConnections || of_uid >= kMaxConnectionsPerUid) {
      RefuseAtAccept(conn, open.size() >= kMaxConnections
                               ? absl::StrCat("transfer socket: ", open.size(),
                                              " connections open, at most ", kMaxConnections)
                               : absl::StrCat("transfer socket: uid ", cred.uid, " has ", of_uid,
                                              " connections open, at most ",
                                              kMaxConnectionsPerUid, " a uid"));
      continue;
    }
    std::shared_ptr<UidBuffered>& buffered = buffered_[cred.uid];
    if (buffered == nullptr) buffered = std::make_shared<UidBuffered>(0);
    open.push_back(std::make_shared<Connection>(std::move(conn), cred.uid,
                                                calls_for_({cred.uid, cred.gid, cred.pid}),
                                                starters_, wake_, buffered));
  }
}

}  // namespace ferry::server
