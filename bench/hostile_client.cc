#include "bench/hostile_client.h"

#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/frame.h"
#include "base/unique_fd.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"

namespace ferry::soak {
namespace {

std::atomic<bool> stopping{false};

void OnTerm(int) { stopping.store(true); }

// A client of `socket`, made again when the agent restarted under it.
std::unique_ptr<Client> Reconnect(const std::string& socket) {
  while (!stopping.load()) {
    auto c = Client::Connect(socket, absl::Seconds(2), "hostile");
    if (c.ok()) return *std::move(c);
    absl::SleepFor(absl::Milliseconds(100));
  }
  return nullptr;
}

// Its target on node-b: "hostile-<pid>", made on its own node-b session.
std::string TargetName() { return absl::StrCat("hostile-", getpid()); }

void Shrink(const std::string& socket_a) {
  while (!stopping.load()) {
    std::unique_ptr<Client> a = Reconnect(socket_a);
    if (a == nullptr) return;
    for (int i = 0; i < 1000 && !stopping.load(); ++i) {
      UniqueFd fd(memfd_create("hostile", MFD_CLOEXEC));
      if (!fd.valid() || ftruncate(fd.get(), 1 << 20) != 0) continue;
      auto reg = a->RegisterFd(fd.get(), 0, 1 << 20);
      if (!reg.ok()) break;
      std::thread cut([&fd] {
        absl::SleepFor(absl::Microseconds(200));
        (void)!ftruncate(fd.get(), 0);
      });
      a->Run({{ferry::v1::WRITE, reg->buffer().id(), 0, "node-b", TargetName(), 0, 1 << 20}},
             absl::Seconds(5));
      cut.join();
      a->DeregisterMemory(reg->buffer().id()).IgnoreError();
    }
  }
}

void Flood(const std::string& socket_a) {
  uint64_t n = 0;
  while (!stopping.load()) {
    std::unique_ptr<Client> a = Reconnect(socket_a);
    if (a == nullptr) return;
    auto src = a->Alloc(4096);
    if (!src.ok()) continue;
    TensorClient tensors(a->shared_session());
    for (int i = 0; i < 100000 && !stopping.load(); ++i) {
      auto w = tensors.WriteBlocks((*src)->id(), "node-b", TargetName(), {{0, 0, 64}},
                                   absl::StrCat("flood/", n++));
      if (!w.ok()) break;
    }
  }
}

void Hoard(const std::string& socket_a) {
  while (!stopping.load()) {
    std::unique_ptr<Client> a = Reconnect(socket_a);
    if (a == nullptr) return;
    auto src = a->Alloc(4096);
    if (!src.ok()) continue;
    for (int i = 0; i < 100000 && !stopping.load(); ++i) {
      // Small transfers, many at once (row 7: 10k outstanding handles): what is measured is
      // whether a client's count of transfers buys it anything, not its bytes (a client
      // moving much data is no abuse, and takes its turn like any other).
      auto id = a->Submit({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", TargetName(), 0,
                            4096}});
      // Refused past its limit (RESOURCE_EXHAUSTED): it tries again soon, as a greedy client.
      if (!id.ok()) absl::SleepFor(absl::Milliseconds(20));
      if (!id.ok() && !absl::IsResourceExhausted(id.status())) break;
    }
  }
}

void Frames(const std::string& socket_a) {
  const std::string path = socket_a + ".transfers";
  const std::string chunk(1 << 20, 'h');
  while (!stopping.load()) {
    std::vector<UniqueFd> held;
    for (int c = 0; c < 8 && !stopping.load(); ++c) {
      UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_un addr = {};
      addr.sun_family = AF_UNIX;
      std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
      if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) break;
      std::string start(kTransferSocketHello, kTransferSocketHelloBytes);
      AppendFrameHeader(kMaxFrameBytes - (4 << 20), &start);
      if (send(fd.get(), start.data(), start.size(), MSG_NOSIGNAL) < 0) continue;
      timeval tv = {1, 0};
      setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      for (int mib = 0; mib < 56 && !stopping.load(); ++mib) {
        if (send(fd.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0) break;
      }
      held.push_back(std::move(fd));
    }
    for (int i = 0; i < 20 && !stopping.load(); ++i) absl::SleepFor(absl::Milliseconds(100));
  }
}

// Spins `share` of each 10 ms and sleeps the rest: CPU taken, nothing asked of the agents.
void Burn(double share) {
  const absl::Duration period = absl::Milliseconds(10);
  while (!stopping.load()) {
    const absl::Time until = absl::Now() + period * share;
    while (absl::Now() < until) {
    }
    absl::SleepFor(period * (1 - share));
  }
}

}  // namespace

int RunHostileClient(const std::string& socket_a, const std::string& socket_b, uid_t uid) {
  signal(SIGTERM, OnTerm);
  if (uid != getuid()) {
    if (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0) {
      std::perror("ferry-soak hostile: dropping to the other uid");
      return 3;
    }
  }
  // Its target on node-b, on a session of its own there, made again after a restart.
  std::thread target([&] {
    while (!stopping.load()) {
      std::unique_ptr<Client> b = Reconnect(socket_b);
      if (b == nullptr) return;
      auto buffer = b->Alloc(64 << 20, TargetName());
      while (buffer.ok() && !stopping.load() && b->GetInfo().ok()) {
        absl::SleepFor(absl::Milliseconds(200));
      }
    }
  });
  absl::SleepFor(absl::Milliseconds(500));
  // $FERRY_HOSTILE_TRICKS: a comma-separated subset (to see what each costs the others).
  const char* env = std::getenv("FERRY_HOSTILE_TRICKS");
  const std::string tricks = env != nullptr ? env : "shrink,flood,hoard,frames";
  auto wants = [&](const char* trick) { return absl::StrContains(tricks, trick); };
  std::vector<std::thread> threads;
  if (wants("shrink")) threads.emplace_back([&] { Shrink(socket_a); });
  if (wants("flood")) threads.emplace_back([&] { Flood(socket_a); });
  if (wants("hoard")) threads.emplace_back([&] { Hoard(socket_a); });
  if (wants("frames")) threads.emplace_back([&] { Frames(socket_a); });
  if (wants("burn")) {
    const char* share = std::getenv("FERRY_HOSTILE_BURN");
    double cores = share != nullptr ? std::atof(share) : 0.5;
    // More than one core: one thread per core, each its share.
    for (int i = 0; cores > 0 && i < 8; ++i, cores -= 1) {
      threads.emplace_back([s = std::min(cores, 1.0)] { Burn(s); });
    }
  }
  for (auto& t : threads) t.join();
  target.join();
  return 0;
}

}  // namespace ferry::soak
