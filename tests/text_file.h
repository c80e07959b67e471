#pragma once
// Reading what agents and tools wrote (logs, installed files), for the integration suites.

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ferry {

// The whole file; "" if it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits until the file at `path` (a log being written) contains `text`; false on timeout.
inline bool WaitForText(const std::string& path, const std::string& text,
                        absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (ReadFile(path).find(text) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// The last `bytes` of a log, on stderr under a header naming `who`: after a failure, the
// agents' own words are the best clue.
inline void PrintLogTail(const std::string& who, const std::string& path, size_t bytes = 3000) {
  std::string text = ReadFile(path);
  std::fprintf(stderr, "---- %s log (last %zu bytes) ----\n%s\n", who.c_str(), bytes,
               text.substr(text.size() > bytes ? text.size() - bytes : 0).c_str());
}

}  // namespace ferry
