#pragma once
// The process's budget of file descriptors. A server that accepts connections must not let
// them take its last fds: gRPC 1.51's listener stops for good on one EMFILE
// (tcp_server_posix.cc: "Failed accept4" ends its accept loop), so connection caps are
// kept below the limit with room to spare.

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>

namespace ferry {

// Raises the soft RLIMIT_NOFILE to the hard limit (as servers do; systemd's LimitNOFILE
// sets the hard one) and returns the soft limit now in force.
inline uint64_t RaiseOpenFileLimit() {
  rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? (1ull << 20) : limit.rlim_cur;
}

// How many fds incoming data connections may hold under a limit of `open_files`: all but a
// reserve (a quarter, at least 64) for gRPC, clients, pools and outgoing connections.
inline uint64_t ConnectionFdBudget(uint64_t open_files) {
  uint64_t reserve = std::max<uint64_t>(64, open_files / 4);
  return open_files > reserve + 8 ? open_files - reserve : 8;
}

}  // namespace ferry
