#pragma once
// The device's asynchronous events (ibv_get_async_event(3)): port down or up, a QP or CQ in
// error, the device lost. Nothing else reports them: a QP whose port went down only fails
// after its transport retries, a fatal QP only on the next completion, a lost device never.
// One reader thread per device takes each event, acknowledges it, logs it and hands what it
// means to the device's handler.

#include <infiniband/verbs.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "transport/verbs/verbs_api.h"

namespace ferry::verbs {

// What an event means for the provider: a pure function of the event, tested on its own.
struct AsyncEventMeaning {
  enum Kind {
    kInformational,  // logged only (COMM_EST, SQ_DRAINED, LID/PKEY/SM change, ...)
    kQpBroken,       // QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, PATH_MIG_ERR: that QP is dead
    kCqBroken,       // CQ_ERR (an overrun): the CQ takes no more completions
    kPortDown,       // PORT_ERR: every QP on the port fails after its retries; fail now
    kPortUp,         // PORT_ACTIVE
    kDeviceLost,     // DEVICE_FATAL: nothing on the device works any more
  };
  Kind kind = kInformational;
  ibv_event_type type = IBV_EVENT_COMM_EST;
  // What the event names, copied out before it is acknowledged (the objects behind the
  // event's pointers may go once it is). `cq` is only ever compared, never dereferenced.
  uint32_t qpn = 0;
  const ibv_cq* cq = nullptr;
  int port = 0;
  bool warning = false;  // log as a warning (or an error for a lost device)
  // "IBV_EVENT_PORT_ERR on mlx5_0 port 1" style text, for logs and statuses.
  std::string text;
};
AsyncEventMeaning ClassifyAsyncEvent(const ibv_async_event& event, const std::string& device);

class AsyncEventReader {
 public:
  // Runs on the reader thread, after the event was acknowledged.
  using Handler = std::function<void(const AsyncEventMeaning&)>;
  // Makes context->async_fd non-blocking (so the thread can stop) and starts the thread.
  // The error of fcntl or eventfd when that fails.
  static absl::StatusOr<std::unique_ptr<AsyncEventReader>> Start(VerbsApi* api,
                                                                 ibv_context* context,
                                                                 std::string device,
                                                                 Handler handler);
  // Stops and joins the thread; the handler is not called after this returns.
  ~AsyncEventReader();

  // Events read so far (tests wait on it).
  uint64_t events_seen() const { return seen_.load(); }
  bool OnReaderThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  AsyncEventReader(VerbsApi* api, ibv_context* context, std::string device, Handler handler,
                   UniqueFd wake);
  void Loop();

  VerbsApi* const api_;
  ibv_context* const context_;
  const std::string device_;
  const Handler handler_;
  const UniqueFd wake_;  // an eventfd written to stop the thread
  std::atomic<uint64_t> seen_{0};
  std::thread thread_;
};

}  // namespace ferry::verbs
