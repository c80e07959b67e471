// A client process for the session tests: connects to an agent, allocates COUNT buffers of
// SIZE bytes (owned by its session), prints "ready", then either waits to be killed (MODE
// "wait": a crashed client) or exits at once without freeing anything (MODE "exit"). MODE
// "register": registers COUNT ranges of SIZE bytes of its own memfd instead, prepares an
// exported block list over them, and exits at once without deregistering anything.
//
//   session_client_helper SOCKET COUNT SIZE MODE

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "client/block_client.h"
#include "client/ferry_client.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: session_client_helper SOCKET COUNT SIZE wait|exit|register\n");
    return 2;
  }
  auto client = ferry::Client::Connect(argv[1], absl::Seconds(5), "session helper");
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const int count = std::atoi(argv[2]);
  const uint64_t size = std::strtoull(argv[3], nullptr, 10);
  if (std::string(argv[4]) == "register") {
    int fd = memfd_create("session-helper", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size * count)) != 0) return 1;
    std::vector<ferry::v1::BlockExtent> extents;
    for (int i = 0; i < count; ++i) {
      auto r = (*client)->RegisterFd(fd, i * size, size, "host", "helper." + std::to_string(i));
      if (!r.ok()) {
        std::fprintf(stderr, "register: %s\n", r.status().ToString().c_str());
        return 1;
      }
      extents.push_back(ferry::Extent(r->buffer().id(), 0, size, 1));
    }
    auto list = ferry::BlockClient((*client)->shared_session()).Prepare(extents, "helper-list");
    if (!list.ok()) {
      std::fprintf(stderr, "prepare: %s\n", list.status().ToString().c_str());
      return 1;
    }
    std::_Exit(0);  // no destructors: nothing deregistered or released here
  }
  std::vector<std::unique_ptr<ferry::Buffer>> buffers;
  for (int i = 0; i < count; ++i) {
    auto b = (*client)->Alloc(std::strtoull(argv[3], nullptr, 10));
    if (!b.ok()) {
      std::fprintf(stderr, "alloc: %s\n", b.status().ToString().c_str());
      return 1;
    }
    buffers.push_back(*std::move(b));
  }
  std::printf("ready\n");
  std::fflush(stdout);
  if (std::string(argv[4]) == "exit") std::_Exit(0);  // no destructors: nothing freed here
  while (true) pause();
}
