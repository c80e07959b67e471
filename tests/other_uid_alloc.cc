// A local client of another uid that allocates from the agent and maps what it got (issue
// 44 row 11: a non-root client of a root agent could not, since the pool was reached by
// /proc/<agent pid>/fd/N). Run as root; it drops to UID first. Prints one line per step,
// "<what>: <code> <message>" (tests/report_lines.h reads them).
//
//   other_uid_alloc UID SOCKET NODE own          alloc, write, WRITE and READ through NODE
//                                                (this agent), compare; a persisting buffer
//                                                left behind ("persisted: ID")
//   other_uid_alloc UID SOCKET NODE steal ID     borrow buffer ID's file over the fd socket

#include <grp.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/ferry_client.h"
#include "client/shared_memory.h"

namespace {

void Report(const std::string& what, const absl::Status& s) {
  std::printf("%s: %d %s\n", what.c_str(), static_cast<int>(s.code()),
              std::string(s.message()).c_str());
}

int Own(const std::string& socket, const std::string& node) {
  auto client = ferry::Client::Connect(socket);
  if (!client.ok()) {
    Report("connect", client.status());
    return 0;
  }
  constexpr uint64_t kSize = 1 << 20;
  const std::string name = absl::StrCat("landing-", getuid());
  auto src = (*client)->Alloc(kSize);
  Report("alloc", src.status());
  auto landing = (*client)->Alloc(kSize, name);
  auto back = (*client)->Alloc(kSize);
  if (!src.ok() || !landing.ok() || !back.ok()) return 0;
  for (uint64_t i = 0; i < kSize; ++i) (*src)->data()[i] = static_cast<char>(i * 7 + 3);
  Report("write", (*client)->Write(**src, 0, node, name, 0, kSize));
  Report("read", (*client)->Read(**back, 0, node, name, 0, kSize));
  const bool same = std::memcmp((*src)->data(), (*landing)->data(), kSize) == 0 &&
                    std::memcmp((*src)->data(), (*back)->data(), kSize) == 0;
  std::printf("verified: %d\n", same ? 1 : 0);

  // Its own buffer's file is its to map, not to resize.
  auto info = (*client)->GetInfo();
  if (!info.ok()) return 0;
  auto file = ferry::BorrowBufferFile(info->fd_socket(), (*src)->id());
  Report("borrow own", file.status());
  if (file.ok()) {
    const bool refused = ftruncate(file->get(), 0) != 0;
    std::printf("truncate own: %s\n", refused ? strerror(errno) : "done");
  }

  // One that stays after this client: what another uid then tries to borrow.
  auto kept = (*client)->Alloc(4096, "", "host", /*persist=*/true);
  Report("persist", kept.status());
  if (kept.ok()) std::printf("persisted: %lu\n", static_cast<unsigned long>((*kept)->id()));
  return 0;
}

int Steal(const std::string& socket, uint64_t id) {
  auto client = ferry::Client::Connect(socket);
  if (!client.ok()) {
    Report("connect", client.status());
    return 0;
  }
  auto info = (*client)->GetInfo();
  if (!info.ok()) return 0;
  Report("steal", ferry::BorrowBufferFile(info->fd_socket(), id).status());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t uid = 0;
  if (argc < 5 || !absl::SimpleAtoi(argv[1], &uid)) {
    std::fprintf(stderr, "usage: %s UID SOCKET NODE own|steal [ID]\n", argv[0]);
    return 2;
  }
  // Groups first, while still root.
  if (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0) {
    std::perror("dropping to the other uid");
    return 3;
  }
  const std::string mode = argv[4];
  if (mode == "own") return Own(argv[2], argv[3]);
  uint64_t id = 0;
  if (mode == "steal" && argc == 6 && absl::SimpleAtoi(argv[5], &id)) return Steal(argv[2], id);
  return 2;
}
