// A client process for the session tests: connects to an agent, allocates COUNT buffers of
// SIZE bytes (owned by its session), prints "ready", then either waits to be killed (MODE
// "wait": a crashed client) or exits at once without freeing anything (MODE "exit").
//
//   session_client_helper SOCKET COUNT SIZE MODE

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "client/ferry_client.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: session_client_helper SOCKET COUNT SIZE wait|exit\n");
    return 2;
  }
  auto client = ferry::Client::Connect(argv[1], absl::Seconds(5), "session helper");
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<ferry::Buffer>> buffers;
  for (int i = 0; i < std::atoi(argv[2]); ++i) {
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
