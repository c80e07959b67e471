#include "transport/tcp/tcp_connection.h"

#include <sys/socket.h>

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
    for (auto& [id, r] : outstanding_) failed.push_back(std::move(r));
    queue_.clear();
    outstanding_.clear();
  }
  for (auto& r : failed) std::move(r.done)(why);
}

void TcpConnection::SendLoop() {
  while (true) {
    RequestHeader header;
    char* local;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](TcpConnection* c) ABSL_NO_THREAD_SAFETY_ANALYSIS { return c->failed_ || !c->queue_.empty(); },
          this));
      if (failed_) return;
      Request request = std::move(queue_.front());
      queue_.pop_front();
      request.header.id = next_id_++;
      header = request.header;
      local = request.local;
      // Outstanding before the bytes leave, so the answer always finds it.
      outstanding_.emplace(header.id, std::move(request));
    }
    bool has_payload = header.op != WireOp::kRead;
    iovec iov[2] = {{&header, sizeof(header)}, {local, has_payload ? header.length : 0}};
    absl::Status s = SendAll(fd_.get(), iov, has_payload ? 2 : 1);
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
  while (true) {
    ResponseHeader resp;
    absl::Status s = RecvAll(fd_.get(), &resp, sizeof(resp));
    if (s.ok() && resp.magic != kResponseMagic) s = absl::DataLossError("bad response header");
    Request request;
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      auto it = outstanding_.find(resp.id);
      if (it == outstanding_.end()) {
        s = absl::DataLossError(absl::StrCat("answer for unknown request ", resp.id));
      } else {
        request = std::move(it->second);
        outstanding_.erase(it);
      }
    }
    if (!s.ok()) {
      Fail(absl::UnavailableError(absl::StrCat("tcp: connection to ", peer_, ": ", s.message())));
      return;
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
        Fail(result);
        return;
      }
    }
    std::move(request.done)(result);
  }
}

}  // namespace ferry::tcp
