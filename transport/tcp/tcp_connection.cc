#include "transport/tcp/tcp_connection.h"

#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/tcp/socket.h"

namespace ferry::tcp {

TcpConnection::TcpConnection(UniqueFd fd, std::string peer)
    : fd_(std::move(fd)), peer_(std::move(peer)) {
  sender_ = std::thread([this] { SendLoop(); });
  receiver_ = std::thread([this] { RecvLoop(); });
}

TcpConnection::~TcpConnection() {
  Fail(absl::UnavailableError(absl::StrCat("tcp: connection to ", peer_, " closed")));
  sender_.join();
  receiver_.join();
}

bool TcpConnection::failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

absl::Status TcpConnection::Enqueue(Request request) {
  absl::MutexLock lock(&mu_);
  if (failed_) return absl::UnavailableError(absl::StrCat("tcp: connection to ", peer_, " is broken"));
  queue_.push_back(std::move(request));
  return absl::OkStatus();
}

void TcpConnection::Fail(const absl::Status& why) {
  std::vector<Request> failed;
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return;
    failed_ = true;
    shutdown(fd_.get(), SHUT_RDWR);  // wakes both threads
    for (auto& r : queue_) failed.push_back(std::move(r));
    for (auto& r : outstanding_) failed.push_back(std::move(r));
    queue_.clear();
    outstanding_.clear();
  }
  for (auto& r : failed) std::move(r.done)(why);
}

void TcpConnection::SendLoop() {
  // Several queued requests leave in one sendmsg: headers and payloads interleaved, the
  // payloads still straight from their regions.
  constexpr size_t kMaxBatch = 32;
  constexpr uint64_t kMaxBatchBytes = 1 << 20;
  std::vector<RequestHeader> headers;
  std::vector<iovec> iov;
  headers.reserve(kMaxBatch);
  iov.reserve(2 * kMaxBatch);
  while (true) {
    headers.clear();
    iov.clear();
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](TcpConnection* c) ABSL_NO_THREAD_SAFETY_ANALYSIS { return c->failed_ || !c->queue_.empty(); },
          this));
      if (failed_) return;
      uint64_t bytes = 0;
      while (!queue_.empty() && headers.size() < kMaxBatch && bytes < kMaxBatchBytes) {
        Request request = std::move(queue_.front());
        queue_.pop_front();
        request.header.id = next_id_++;
        headers.push_back(request.header);
        if (request.header.op != WireOp::kRead) {
          iov.push_back({request.local, request.header.length});
          bytes += request.header.length;
        } else {
          iov.push_back({nullptr, 0});
        }
        // Outstanding before the bytes leave, so the answer always finds it.
        outstanding_.push_back(std::move(request));
      }
    }
    // Interleave: header i then payload i (empty for READ).
    std::vector<iovec> wire;
    wire.reserve(2 * headers.size());
    for (size_t i = 0; i < headers.size(); ++i) {
      wire.push_back({&headers[i], sizeof(RequestHeader)});
      if (iov[i].iov_len > 0) wire.push_back(iov[i]);
    }
    absl::Status s = SendAll(fd_.get(), wire.data(), static_cast<int>(wire.size()));
    if (!s.ok()) {
      Fail(absl::UnavailableError(absl::StrCat("tcp: send to ", peer_, ": ", s.message())));
      return;
    }
  }
}

absl::Status TcpConnection::Refused(Refusal refusal, const RequestHeader& h) const {
  std::string what = absl::StrFormat("%s of %d bytes at 0x%x key 0x%x on %s",
                                     h.op == WireOp::kRead ? "READ" : "WRITE", h.length, h.address,
                                     h.key, peer_);
  switch (refusal) {
    case Refusal::kBadKey:
      return absl::PermissionDeniedError(absl::StrCat("remote key unknown or revoked: ", what));
    case Refusal::kOutOfBounds:
      return absl::OutOfRangeError(absl::StrCat("range outside the remote region: ", what));
    case Refusal::kAccess:
      return absl::PermissionDeniedError(absl::StrCat("remote region does not allow it: ", what));
    default:
      return absl::InternalError(absl::StrCat("peer refused the op: ", what));
  }
}

void TcpConnection::RecvLoop() {
  // The target answers in request order, so the kind of each coming answer is known: a run
  // of WRITE acks is read in one recv, while a READ answer's payload goes straight into its
  // destination region (never through this buffer).
  constexpr size_t kMaxAcks = 64;
  std::vector<ResponseHeader> acks(kMaxAcks);
  size_t have = 0;  // bytes of acks[] already received
  while (true) {
    size_t writes_ahead = 0;
    {
      absl::MutexLock lock(&mu_);
      for (const Request& r : outstanding_) {
        if (r.header.op == WireOp::kRead || writes_ahead == kMaxAcks) break;
        ++writes_ahead;
      }
    }
    // Expect at least one answer; at most the WRITE acks we know are coming.
    size_t want = std::max<size_t>(writes_ahead, 1) * sizeof(ResponseHeader);
    char* buf = reinterpret_cast<char*>(acks.data());
    absl::Status s = absl::OkStatus();
    while (s.ok() && have < sizeof(ResponseHeader)) {
      ssize_t n = recv(fd_.get(), buf + have, want - have, 0);
      if (n > 0) {
        have += static_cast<size_t>(n);
      } else if (n == 0) {
        s = absl::UnavailableError("recv(): connection closed by peer");
      } else if (errno != EINTR) {
        s = absl::ErrnoToStatus(errno, "recv()");
      }
    }
    size_t complete = have / sizeof(ResponseHeader);
    for (size_t i = 0; s.ok() && i < complete; ++i) s = Answer(acks[i]);
    if (!s.ok()) {
      Fail(absl::UnavailableError(absl::StrCat("tcp: connection to ", peer_, ": ", s.message())));
      return;
    }
    // Keep a partial header for the next round.
    size_t rest = have - complete * sizeof(ResponseHeader);
    std::memmove(buf, buf + complete * sizeof(ResponseHeader), rest);
    have = rest;
  }
}

absl::Status TcpConnection::Answer(const ResponseHeader& resp) {
  if (resp.magic != kResponseMagic) return absl::DataLossError("bad response header");
  Request request;
  {
    absl::MutexLock lock(&mu_);
    if (outstanding_.empty() || outstanding_.front().header.id != resp.id) {
      return absl::DataLossError(absl::StrCat("answer for unexpected request ", resp.id));
    }
    request = std::move(outstanding_.front());
    outstanding_.pop_front();
  }
  absl::Status result = absl::OkStatus();
  if (resp.refusal != Refusal::kNone) {
    result = Refused(resp.refusal, request.header);
  } else if (request.header.op == WireOp::kRead) {
    // READ payload goes straight into the destination region.
    absl::Status r = RecvAll(fd_.get(), request.local, resp.length);
    if (!r.ok()) {
      result = absl::UnavailableError(absl::StrCat("tcp: READ from ", peer_, ": ", r.message()));
      std::move(request.done)(result);
      return result;
    }
  }
  std::move(request.done)(result);
  return absl::OkStatus();
}

}  // namespace ferry::tcp
