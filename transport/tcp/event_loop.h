#pragma once
// One epoll loop on its own thread: sockets with their handlers, tasks posted from any thread
// (woken through an eventfd) and one-shot timers. The tcp provider drives all its sockets from
// a few of these, so its threads grow with cores, not with peers or connections.

#include <sys/epoll.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"

namespace ferry::tcp {

// Bytes one connection moves per wakeup in each direction before its loop's other connections
// get their turn (level-triggered epoll calls it again at once). Small: an express
// connection's op waits for at most this much of each bulk one on its loop.
inline constexpr uint64_t kLoopRoundBytes = 1 << 20;

class EventLoop {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    // Runs on the loop thread with what epoll reported (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP).
    // Level-triggered: a handler that stops early (its share of this round) is called again.
    virtual void OnEvents(uint32_t events) = 0;
  };
  using Task = absl::AnyInvocable<void() &&>;

  static absl::StatusOr<std::unique_ptr<EventLoop>> Create(std::string name);
  // Runs the tasks posted so far, then stops the thread and drops the handlers and timers.
  ~EventLoop();

  // Any thread: runs `task` on the loop thread after the tasks posted before it. False, and
  // the task is dropped unrun, once the loop is stopping.
  bool Post(Task task);

  // The loop whose thread is calling, or nullptr on any other thread.
  static EventLoop* Current();
  bool OnLoopThread() const { return Current() == this; }

  // Loop thread only. Watches `fd` for `events` (level-triggered) and keeps `handler` alive
  // until Remove; returns the token that names the registration.
  absl::StatusOr<uint64_t> Add(int fd, uint32_t events, std::shared_ptr<Handler> handler);
  absl::Status Modify(uint64_t token, uint32_t events);
  // Stops watching; events of this round already gathered for the token are dropped, so a
  // handler never runs after its Remove. Call before closing the fd.
  void Remove(uint64_t token);
  // Loop thread only: runs `task` once, `delay` from now (dropped if the loop stops first).
  void RunAfter(absl::Duration delay, Task task);

  const std::string& name() const { return name_; }

 private:
  struct Watched {
    int fd;
    std::shared_ptr<Handler> handler;
  };
  EventLoop(UniqueFd epoll, UniqueFd wake, std::string name);
  void Run();
  void RunDueTimers();
  // Runs the tasks posted so far; false once the loop is stopping and none are left.
  bool RunTasks();

  const std::string name_;
  const UniqueFd epoll_;
  const UniqueFd wake_;  // eventfd: a Post from another thread interrupts epoll_wait

  // Loop thread only.
  absl::flat_hash_map<uint64_t, Watched> watched_;
  uint64_t next_token_ = 1;  // 0 names the eventfd
  std::multimap<absl::Time, Task> timers_;

  absl::Mutex mu_;
  std::vector<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;  // the eventfd was written since the loop last ran
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // last: starts after every member above exists
};

// The loops of one role in a fabric, handed out in turn to new connections.
class EventLoopPool {
 public:
  // `count` loops named `name`-0, `name`-1, ...; 0 picks min(cores, 4).
  static absl::StatusOr<std::unique_ptr<EventLoopPool>> Create(uint32_t count,
                                                               const std::string& name);
  // Stops every loop (see ~EventLoop).
  ~EventLoopPool() = default;

  EventLoop* Next();
  EventLoop* at(size_t i) const { return loops_[i % loops_.size()].get(); }
  size_t size() const { return loops_.size(); }
  bool Contains(const EventLoop* loop) const;

 private:
  explicit EventLoopPool(std::vector<std::unique_ptr<EventLoop>> loops)
      : loops_(std::move(loops)) {}
  const std::vector<std::unique_ptr<EventLoop>> loops_;
  absl::Mutex mu_;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

// What TcpOptions::event_loops = 0 means: one loop per core, at most four.
uint32_t DefaultEventLoops();

}  // namespace ferry::tcp
