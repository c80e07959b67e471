#include "transport/verbs/async_events.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>

#include <cerrno>
#include <iterator>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace ferry::verbs {
namespace {

// "IBV_EVENT_PORT_ERR (port error)": the enum's name, which operators grep for and vendors'
// guides use, and rdma-core's words for it.
std::string EventName(ibv_event_type type) {
  static constexpr const char* kNames[] = {
      "IBV_EVENT_CQ_ERR",          "IBV_EVENT_QP_FATAL",        "IBV_EVENT_QP_REQ_ERR",
      "IBV_EVENT_QP_ACCESS_ERR",   "IBV_EVENT_COMM_EST",        "IBV_EVENT_SQ_DRAINED",
      "IBV_EVENT_PATH_MIG",        "IBV_EVENT_PATH_MIG_ERR",    "IBV_EVENT_DEVICE_FATAL",
      "IBV_EVENT_PORT_ACTIVE",     "IBV_EVENT_PORT_ERR",        "IBV_EVENT_LID_CHANGE",
      "IBV_EVENT_PKEY_CHANGE",     "IBV_EVENT_SM_CHANGE",       "IBV_EVENT_SRQ_ERR",
      "IBV_EVENT_SRQ_LIMIT_REACHED", "IBV_EVENT_QP_LAST_WQE_REACHED",
      "IBV_EVENT_CLIENT_REREGISTER", "IBV_EVENT_GID_CHANGE",   "IBV_EVENT_WQ_FATAL",
  };
  const int i = static_cast<int>(type);
  const char* name = i >= 0 && i < static_cast<int>(std::size(kNames)) ? kNames[i] : "event";
  return absl::StrFormat("%s (%s)", name, ibv_event_type_str(type));
}

}  // namespace

AsyncEventMeaning ClassifyAsyncEvent(const ibv_async_event& event, const std::string& device) {
  AsyncEventMeaning m;
  const std::string name = EventName(event.event_type);
  m.type = event.event_type;
  switch (event.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR:
      m.kind = AsyncEventMeaning::kQpBroken;
      m.warning = true;
      m.qpn = event.element.qp != nullptr ? event.element.qp->qp_num : 0;
      m.text = absl::StrFormat("%s on %s QP 0x%x", name, device, m.qpn);
      break;
    case IBV_EVENT_CQ_ERR:
      m.kind = AsyncEventMeaning::kCqBroken;
      m.warning = true;
      m.cq = event.element.cq;
      m.text = absl::StrFormat("%s on %s: a CQ overran or failed; its QPs are lost", name,
                               device);
      break;
    case IBV_EVENT_PORT_ERR:
      m.kind = AsyncEventMeaning::kPortDown;
      m.port = event.element.port_num;
      m.warning = true;
      m.text = absl::StrFormat("%s on %s port %d: the link went down", name, device,
                               event.element.port_num);
      break;
    case IBV_EVENT_PORT_ACTIVE:
      m.kind = AsyncEventMeaning::kPortUp;
      m.port = event.element.port_num;
      m.text = absl::StrFormat("%s on %s port %d: the link is up", name, device,
                               event.element.port_num);
      break;
    case IBV_EVENT_DEVICE_FATAL:
      m.kind = AsyncEventMeaning::kDeviceLost;
      m.warning = true;
      m.text = absl::StrFormat("%s on %s: the device must be reset or reopened", name, device);
      break;
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
      // The port's addressing changed: connections made from now on see the new values,
      // live ones keep working or fail through their QP.
      m.warning = true;
      m.text = absl::StrFormat("%s on %s port %d", name, device, event.element.port_num);
      break;
    default:
      m.text = absl::StrFormat("%s on %s", name, device);
      break;
  }
  return m;
}

absl::StatusOr<std::unique_ptr<AsyncEventReader>> AsyncEventReader::Start(VerbsApi* api,
                                                                           ibv_context* context,
                                                                           std::string device,
                                                                           Handler handler) {
  // ibv_get_async_event blocks on async_fd unless it is non-blocking (ibv_get_async_event(3)
  // shows exactly this fcntl); the thread then waits in poll() beside a wake-up eventfd.
  const int fd = context->async_fd;
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrFormat("fcntl(%s async_fd %d, O_NONBLOCK)", device, fd));
  }
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return absl::ErrnoToStatus(errno, "eventfd(async event reader)");
  return std::unique_ptr<AsyncEventReader>(new AsyncEventReader(
      api, context, std::move(device), std::move(handler), std::move(wake)));
}

AsyncEventReader::AsyncEventReader(VerbsApi* api, ibv_context* context, std::string device,
                                   Handler handler, UniqueFd wake)
    : api_(api),
      context_(context),
      device_(std::move(device)),
      handler_(std::move(handler)),
      wake_(std::move(wake)) {
  thread_ = std::thread([this] { Loop(); });
}

AsyncEventReader::~AsyncEventReader() {
  const uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) != sizeof(one)) {
    spdlog::warn("verbs: waking the event reader of {}: {}", device_, strerror(errno));
  }
  thread_.join();
}

void AsyncEventReader::Loop() {
  pollfd fds[2] = {{context_->async_fd, POLLIN, 0}, {wake_.get(), POLLIN, 0}};
  while (true) {
    int ready = poll(fds, 2, -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      spdlog::error("verbs: poll(async_fd of {}) failed: {}; events are no longer read",
                    device_, strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    while (true) {
      ibv_async_event event = {};
      errno = 0;
      if (api_->GetAsyncEvent(context_, &event) != 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          spdlog::error("verbs: ibv_get_async_event({}) failed: {}; events are no longer read",
                        device_, strerror(errno));
          return;
        }
        break;
      }
      const AsyncEventMeaning meaning = ClassifyAsyncEvent(event, device_);
      // Acknowledged before it is acted on: the handler may end in destroying the QP the
      // event names, and ibv_destroy_qp waits until its events are acknowledged.
      api_->AckAsyncEvent(&event);
      ++seen_;
      if (meaning.kind == AsyncEventMeaning::kDeviceLost) {
        spdlog::error("verbs: {}", meaning.text);
      } else if (meaning.warning) {
        spdlog::warn("verbs: {}", meaning.text);
      } else {
        spdlog::info("verbs: {}", meaning.text);
      }
      handler_(meaning);
    }
  }
}

}  // namespace ferry::verbs
