#include "base/port_owner.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry {
namespace {

constexpr const char* kListen = "0A";  // TCP_LISTEN in /proc/net/tcp's "st" column

// Inodes of sockets listening on `port`, from one of /proc/net/tcp, /proc/net/tcp6.
void ListeningInodes(const std::string& table, uint16_t port, std::vector<std::string>* out) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::vector<std::string> cols = absl::StrSplit(line, ' ', absl::SkipEmpty());
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    if (cols.size() < 10 || cols[3] != kListen) continue;
    std::vector<std::string> local = absl::StrSplit(cols[1], ':');
    uint32_t local_port = 0;
    if (local.size() != 2 || !absl::SimpleHexAtoi(local[1], &local_port)) continue;
    if (local_port == port) out->push_back(cols[9]);
  }
}

}  // namespace

pid_t ListeningPortOwner(uint16_t port) {
  std::vector<std::string> inodes;
  ListeningInodes("/proc/net/tcp", port, &inodes);
  ListeningInodes("/proc/net/tcp6", port, &inodes);
  if (inodes.empty()) return 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return 0;
  pid_t found = 0;
  while (dirent* e = readdir(proc)) {
    pid_t pid = 0;
    if (found != 0 || !absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;
    while (dirent* f = readdir(fds)) {
      char target[64];
      ssize_t n =
          readlink(absl::StrCat(fd_dir, "/", f->d_name).c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      for (const auto& inode : inodes) {
        if (absl::StrCat("socket:[", inode, "]") == target) found = pid;
      }
    }
    closedir(fds);
  }
  closedir(proc);
  return found;
}

}  // namespace ferry
