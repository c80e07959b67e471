#pragma once
// Stopping an agent in a test (SIGSTOP) so that it answers nothing more: kill() only queues
// the signal, and on a loaded machine (or under a sanitizer) a thread may answer one more
// request first, so the test waits until every thread is stopped.

#include <signal.h>
#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ferry {

// SIGSTOP, then waits (up to about 2 s) until every thread of `pid` is in state T.
inline void StopProcess(pid_t pid) {
  kill(pid, SIGSTOP);
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (int i = 0; i < 2000; ++i) {
    bool all = true;
    for (const auto& task : std::filesystem::directory_iterator(tasks)) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      // "tid (comm) S ...": the state follows the last ')' (comm may hold one).
      const size_t paren = line.rfind(')');
      if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'T') {
        all = false;
      }
    }
    if (all) return;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ADD_FAILURE() << "process " << pid << " did not stop";
}

}  // namespace ferry
