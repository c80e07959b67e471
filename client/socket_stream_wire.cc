// StreamWire over a connection of its own to the agent's transfer socket: requests go as
// frames with blocking writes (the agent stops reading past its window, which holds a
// sender back as a gRPC call's flow control does); WritesDone is shutdown(SHUT_WR), after
// which the agent answers every request and closes, so the wire knows its end from the
// count of answers.

#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/frame.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"
#include "client/socket_line.h"
#include "client/stream_wire.h"

namespace ferry {
namespace {

constexpr size_t kReadBytes = 64 << 10;

class SocketWire : public StreamWire {
 public:
  explicit SocketWire(UniqueFd fd) : fd_(std::move(fd)) {}

  bool Write(const ferry::v1::StreamedTransfer& request) override {
    const size_t size = request.ByteSizeLong();
    if (size > kMaxFrameBytes) {
      End(absl::InvalidArgumentError(absl::StrCat("a request of ", size,
                                                  " bytes; the transfer socket takes at most ",
                                                  kMaxFrameBytes)));
      shutdown(fd_.get(), SHUT_RDWR);
      return false;
    }
    std::string frame;
    frame.reserve(kFrameHeaderBytes + size);
    AppendFrameHeader(static_cast<uint32_t>(size), &frame);
    request.AppendToString(&frame);
    written_.fetch_add(1);  // before it goes: its answer may come before send returns
    for (size_t sent = 0; sent < frame.size();) {
      const ssize_t n = send(fd_.get(), frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        End(absl::UnavailableError(
            absl::StrCat("transfer socket: send: ", n < 0 ? strerror(errno) : "nothing sent")));
        return false;
      }
    }
    return true;
  }

  bool WritesDone() override {
    writes_done_.store(true);
    if (shutdown(fd_.get(), SHUT_WR) == 0) return true;
    End(absl::ErrnoToStatus(errno, "transfer socket: shutdown(SHUT_WR)"));
    return false;
  }

  bool Read(ferry::v1::StreamedResults* results) override {
    const int header = Fill(kFrameHeaderBytes);
    if (header <= 0) {
      if (header == 0 && in_end_ == in_begin_) {
        // The agent closed at a frame's end: the wire's end if every request was answered.
        if (cancelled_.load() || !writes_done_.load() || answered_ != written_.load()) {
          End(absl::UnavailableError(absl::StrCat(
              "transfer socket: the agent closed the connection with ",
              written_.load() - answered_, " requests unanswered (it stopped or drains)")));
        }
      } else {
        Broken(header);
      }
      return false;
    }
    const uint32_t length = *FrameLength(Unread());
    if (length > kMaxFrameBytes) {
      End(absl::DataLossError(absl::StrCat("transfer socket: a frame of ", length, " bytes")));
      return false;
    }
    if (const int body = Fill(kFrameHeaderBytes + length); body <= 0) {
      Broken(body);
      return false;
    }
    if (!results->ParseFromArray(in_.data() + in_begin_ + kFrameHeaderBytes,
                                 static_cast<int>(length))) {
      End(absl::DataLossError("transfer socket: an answer that is not a StreamedResults"));
      return false;
    }
    in_begin_ += kFrameHeaderBytes + length;
    answered_ += static_cast<uint64_t>(results->results_size());
    return true;
  }

  void Cancel() override {
    cancelled_.store(true);
    shutdown(fd_.get(), SHUT_RDWR);  // a blocked send or recv returns
  }

  absl::Status Finish() override {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

 private:
  absl::string_view Unread() const {
    return absl::string_view(in_.data() + in_begin_, in_end_ - in_begin_);
  }

  // Reads until `need` bytes are unread: 1, or 0 at the end of the connection, or -1 on an
  // error (errno says which).
  int Fill(size_t need) {
    while (in_end_ - in_begin_ < need) {
      if (in_.size() - in_begin_ < need || in_end_ == in_.size()) {
        in_.erase(0, in_begin_);
        in_end_ -= in_begin_;
        in_begin_ = 0;
        in_.resize(std::max(in_.size(), std::max(need, in_end_ + kReadBytes)));
      }
      const ssize_t n = recv(fd_.get(), in_.data() + in_end_, in_.size() - in_end_, 0);
      if (n > 0) {
        in_end_ += static_cast<size_t>(n);
      } else if (n == 0) {
        return 0;
      } else if (errno != EINTR) {
        return -1;
      }
    }
    return 1;
  }

  // A read that ended mid-frame (0) or failed (-1).
  void Broken(int read) {
    if (read == 0) {
      End(absl::UnavailableError("transfer socket: the agent closed the connection mid-answer"));
    } else {
      End(absl::UnavailableError(absl::StrCat("transfer socket: recv: ", strerror(errno))));
    }
  }

  // The first reason the wire ended is the one Finish gives; after Cancel, that it was
  // cancelled (a send or recv it cut short fails too).
  void End(absl::Status why) {
    if (cancelled_.load()) why = absl::CancelledError("the transfer stream was cancelled");
    absl::MutexLock lock(&mu_);
    if (ended_.ok()) ended_ = std::move(why);
  }

  const UniqueFd fd_;
  std::atomic<uint64_t> written_{0};
  std::atomic<bool> writes_done_{false};
  std::atomic<bool> cancelled_{false};
  // The reader's own.
  std::string in_;
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  uint64_t answered_ = 0;
  absl::Mutex mu_;
  absl::Status ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<StreamWire>> SocketStreamWire(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, ConnectTransferSocket(path));
  // Blocking from here: a Send waits for room as a gRPC Write waits for flow control.
  const int flags = fcntl(fd.get(), F_GETFL);
  if (flags < 0 || fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return absl::ErrnoToStatus(errno, "transfer socket: fcntl(O_NONBLOCK)");
  }
  return std::make_unique<SocketWire>(std::move(fd));
}

}  // namespace ferry
