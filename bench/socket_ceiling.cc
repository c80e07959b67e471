#include "bench/socket_ceiling.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/unique_fd.h"

namespace ferry::bench {
namespace {

// What ferry's tcp provider sends at once: a striped part of a large op is 1 MiB or more.
constexpr uint64_t kSendChunk = 1 << 20;

absl::Status Errno(const std::string& call) {
  return absl::UnavailableError(absl::StrCat("tcp sockets: ", call, ": ", std::strerror(errno)));
}

struct Connection {
  UniqueFd out, in;
};

absl::StatusOr<std::vector<Connection>> Connect(int connections) {
  UniqueFd listener(socket(AF_INET, SOCK_STREAM, 0));
  if (!listener.valid()) return Errno("socket");
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("bind");
  }
  if (listen(listener.get(), connections) != 0) return Errno("listen");
  if (getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("getsockname");
  }
  std::vector<Connection> conns(connections);
  for (Connection& c : conns) {
    c.out.Reset(socket(AF_INET, SOCK_STREAM, 0));
    if (!c.out.valid()) return Errno("socket");
    if (connect(c.out.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return Errno("connect");
    }
    c.in.Reset(accept(listener.get(), nullptr, nullptr));
    if (!c.in.valid()) return Errno("accept");
  }
  return conns;
}

// One run: the seconds `rounds` rounds took, or the first send/recv that failed.
absl::StatusOr<double> MoveRounds(std::vector<Connection>& conns, const char* src, char* dst,
                                  uint64_t size, int rounds) {
  const uint64_t share = size / conns.size();
  std::atomic<bool> failed{false};
  std::string why;  // the first failure's, written once
  std::atomic<bool> claimed{false};
  auto fail = [&](const char* call) {
    if (!claimed.exchange(true)) why = absl::StrCat(call, ": ", std::strerror(errno));
    failed = true;
  };
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < conns.size(); ++i) {
    const uint64_t from = i * share;
    threads.emplace_back([&, i, from] {
      for (int r = 0; r < rounds && !failed; ++r) {
        for (uint64_t done = 0; done < share && !failed;) {
          ssize_t n = send(conns[i].out.get(), src + from + done,
                           std::min(kSendChunk, share - done), MSG_NOSIGNAL);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) fail("send");
          else done += n;
        }
      }
    });
    threads.emplace_back([&, i, from] {
      for (int r = 0; r < rounds && !failed; ++r) {
        for (uint64_t done = 0; done < share && !failed;) {
          ssize_t n = recv(conns[i].in.get(), dst + from + done, share - done, 0);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) fail("recv");
          else done += n;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failed) return absl::UnavailableError(absl::StrCat("tcp sockets: ", why));
  return absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace

absl::StatusOr<Measurement> RunSocketCeiling(int connections, uint64_t size, double min_seconds,
                                             int runs) {
  if (connections < 1 || size < static_cast<uint64_t>(connections)) {
    return absl::InvalidArgumentError("tcp sockets: at least one connection and byte each");
  }
  if (runs < 1) return absl::InvalidArgumentError("tcp sockets: at least one run");
  // Touched before the clock starts, as ferry's buffers are.
  auto src = std::make_unique<char[]>(size);
  auto dst = std::make_unique<char[]>(size);
  std::memset(src.get(), 1, size);
  std::memset(dst.get(), 0, size);
  Measurement best;
  for (int run = 0; run < runs; ++run) {
    auto conns = Connect(connections);
    if (!conns.ok()) return conns.status();
    // One round first, untimed, as ferry's rows and ucx_perftest (-w) warm up. It used to
    // size the timed run too (min_seconds over its time), but a fresh connection's first
    // round is slow (slow start, first touch: 0.13 s against 13 ms after on the 2-core VM),
    // so the timed run came out a tenth of min_seconds long: 70 ms bursts at 6-9 GB/s where
    // these sockets sustain about 5. The timed run now doubles its rounds until it has
    // lasted min_seconds.
    if (auto warm = MoveRounds(*conns, src.get(), dst.get(), size, 1); !warm.ok()) {
      return warm.status();
    }
    double secs = 0;
    uint64_t rounds = 0;
    // Batches of 1, 2, 4, ... rounds (at most 2^20 a batch), at least one.
    for (int batch = 1; rounds == 0 || secs < min_seconds; batch = std::min(2 * batch, 1 << 20)) {
      auto took = MoveRounds(*conns, src.get(), dst.get(), size, batch);
      if (!took.ok()) return took.status();
      secs += *took;
      rounds += batch;
    }
    const uint64_t moved = size / connections * connections * rounds;
    const double gbps = moved / secs / 1e9;
    if (gbps > best.gbps) {
      best.ops = rounds;
      best.bytes = moved;
      best.seconds = secs;
      best.gbps = gbps;
    }
  }
  best.series = "tcp sockets";
  best.size = size;
  best.ops_per_sec = best.seconds > 0 ? best.ops / best.seconds : 0;
  best.note = absl::StrFormat(
      "%d loopback connections, a blocking thread each side, 1 MiB sends, best of %d", connections,
      runs);
  return best;
}

}  // namespace ferry::bench
