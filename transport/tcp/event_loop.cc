#include "transport/tcp/event_loop.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ferry::tcp {
namespace {

thread_local EventLoop* current_loop = nullptr;

constexpr uint64_t kWakeToken = 0;
constexpr int kMaxEvents = 64;

}  // namespace

absl::StatusOr<std::unique_ptr<EventLoop>> EventLoop::Create(std::string name) {
  UniqueFd epoll(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return absl::ErrnoToStatus(errno, absl::StrCat("epoll_create1(", name, ")"));
  UniqueFd wake(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) return absl::ErrnoToStatus(errno, absl::StrCat("eventfd(", name, ")"));
  epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  if (epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake.get(), &ev) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("epoll_ctl(ADD eventfd, ", name, ")"));
  }
  return std::unique_ptr<EventLoop>(new EventLoop(std::move(epoll), std::move(wake), name));
}

EventLoop::EventLoop(UniqueFd epoll, UniqueFd wake, std::string name)
    : name_(std::move(name)), epoll_(std::move(epoll)), wake_(std::move(wake)) {
  thread_ = std::thread([this] { Run(); });
  // At most 15 characters; a longer name is simply not set.
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());
}

EventLoop::~EventLoop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  thread_.join();
}

EventLoop* EventLoop::Current() { return current_loop; }

bool EventLoop::Post(Task task) {
  bool wake = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    tasks_.push_back(std::move(task));
    wake = !std::exchange(woken_, true);
  }
  if (wake) {
    // Only EAGAIN can fail here (the counter is full), and then the loop is awake anyway.
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
  }
  return true;
}

absl::StatusOr<uint64_t> EventLoop::Add(int fd, uint32_t events, std::shared_ptr<Handler> handler) {
  uint64_t token = next_token_++;
  epoll_event ev = {};
  ev.events = events;
  ev.data.u64 = token;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("epoll_ctl(ADD fd ", fd, ", ", name_, ")"));
  }
  watched_.emplace(token, Watched{fd, std::move(handler)});
  return token;
}

absl::Status EventLoop::Modify(uint64_t token, uint32_t events) {
  auto it = watched_.find(token);
  if (it == watched_.end()) return absl::NotFoundError(absl::StrCat(name_, ": no token ", token));
  epoll_event ev = {};
  ev.events = events;
  ev.data.u64 = token;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, it->second.fd, &ev) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("epoll_ctl(MOD fd ", it->second.fd, ", ", name_, ")"));
  }
  return absl::OkStatus();
}

void EventLoop::Remove(uint64_t token) {
  auto it = watched_.find(token);
  if (it == watched_.end()) return;
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.fd, nullptr);
  // The handler may be the caller: keep it alive until this returns to it.
  std::shared_ptr<Handler> keep = std::move(it->second.handler);
  watched_.erase(it);
}

void EventLoop::RunAfter(absl::Duration delay, Task task) {
  timers_.emplace(absl::Now() + delay, std::move(task));
}

void EventLoop::RunDueTimers() {
  absl::Time now = absl::Now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    Task task = std::move(timers_.begin()->second);
    timers_.erase(timers_.begin());
    std::move(task)();
  }
}

bool EventLoop::RunTasks() {
  std::vector<Task> tasks;
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(tasks_);
    woken_ = false;
    stopping = stopping_;
  }
  for (Task& task : tasks) std::move(task)();
  if (!stopping) return true;
  // Tasks accepted before the stop still run (a Close waits for its own); no new ones come.
  absl::MutexLock lock(&mu_);
  return !tasks_.empty();
}

void EventLoop::Run() {
  current_loop = this;
  epoll_event events[kMaxEvents];
  while (true) {
    int timeout_ms = -1;
    if (!timers_.empty()) {
      absl::Duration wait = timers_.begin()->first - absl::Now();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(wait + absl::Microseconds(999)), 0, 60 * 1000));
    }
    int n = epoll_wait(epoll_.get(), events, kMaxEvents, timeout_ms);
    if (n < 0 && errno != EINTR) {
      spdlog::error("tcp: epoll_wait({}): {}", name_, strerror(errno));
      n = 0;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t token = events[i].data.u64;
      if (token == kWakeToken) {
        uint64_t count;
        (void)!read(wake_.get(), &count, sizeof(count));
        continue;
      }
      // Looked up per event: an earlier handler of this round may have removed this one.
      auto it = watched_.find(token);
      if (it == watched_.end()) continue;
      std::shared_ptr<Handler> handler = it->second.handler;
      handler->OnEvents(events[i].events);
    }
    RunDueTimers();
    if (!RunTasks()) break;
  }
  watched_.clear();
  timers_.clear();
  current_loop = nullptr;
}

uint32_t DefaultEventLoops() {
  unsigned cores = std::thread::hardware_concurrency();
  return std::clamp<uint32_t>(cores, 1, 4);
}

absl::StatusOr<std::unique_ptr<EventLoopPool>> EventLoopPool::Create(uint32_t count,
                                                                     const std::string& name) {
  if (count == 0) count = DefaultEventLoops();
  std::vector<std::unique_ptr<EventLoop>> loops;
  for (uint32_t i = 0; i < count; ++i) {
    auto loop = EventLoop::Create(absl::StrCat(name, "-", i));
    if (!loop.ok()) return loop.status();
    loops.push_back(std::move(*loop));
  }
  return std::unique_ptr<EventLoopPool>(new EventLoopPool(std::move(loops)));
}

bool EventLoopPool::Contains(const EventLoop* loop) const {
  return std::any_of(loops_.begin(), loops_.end(),
                     [loop](const auto& mine) { return mine.get() == loop; });
}

EventLoop* EventLoopPool::Next() {
  absl::MutexLock lock(&mu_);
  return loops_[next_++ % loops_.size()].get();
}

}  // namespace ferry::tcp
