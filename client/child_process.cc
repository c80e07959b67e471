#include "client/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

namespace ferry {

absl::StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv,
                                 const std::string& output_path, uint64_t open_files) {
  if (argv.empty()) return absl::InvalidArgumentError("SpawnChild: empty argv");
  // Everything the child needs is prepared before fork: after it only async-signal-safe calls.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::ErrnoToStatus(errno, "fork()");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    if (open_files > 0) {
      rlimit limit = {open_files, open_files};
      setrlimit(RLIMIT_NOFILE, &limit);
    }
    int out = open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out >= 0) {
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
    }
    execvp(args[0], args.data());
    _exit(127);
  }
  return pid;
}

}  // namespace ferry
