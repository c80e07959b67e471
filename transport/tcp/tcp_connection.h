#pragma once
// One TCP connection of an endpoint: a queue of requests, the ops awaiting their answer,
// and the two threads that move them.

#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "transport/fabric.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {

class TcpConnection {
 public:
  struct Request {
    RequestHeader header;
    char* local;  // source (WRITE) or destination (READ) bytes
    fabric::Completion done;
  };

  TcpConnection(UniqueFd fd, std::string peer);
  // Closes (failing what is outstanding) and joins the threads.
  ~TcpConnection();

  // Queues a request; UNAVAILABLE (and `request.done` is not run) once the connection failed.
  absl::Status Enqueue(Request request);
  // Fails every queued and outstanding request with `why` and shuts the socket. Idempotent.
  void Fail(const absl::Status& why);
  bool failed() const;

 private:
  void SendLoop();
  void RecvLoop();
  // Completes the oldest outstanding request with its answer (reading a READ's payload).
  // Errors mean the stream is unusable.
  absl::Status Answer(const ResponseHeader& resp);
  absl::Status Refused(Refusal refusal, const RequestHeader& header) const;

  UniqueFd fd_;
  const std::string peer_;
  uint64_t next_id_ = 1;  // used by SendLoop only

  mutable absl::Mutex mu_;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  // Sent and not yet answered, in id order: the target answers in that order.
  std::deque<Request> outstanding_ ABSL_GUARDED_BY(mu_);

  std::thread sender_;
  std::thread receiver_;
};

}  // namespace ferry::tcp
