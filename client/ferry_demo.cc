// ferry-demo (`make demo`): two real agents on loopback, a client on node-a that fills a
// 256 MiB shared-memory buffer and writes it to node-b, then a KV-cache-shaped batch of
// 1024 scattered 64 KiB blocks; both are read back and checked. Exit code 1 on any
// mismatch. The agents are stopped on the way out, whatever happens.

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/checksum.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"

namespace ferry {
namespace {

constexpr uint64_t kBulk = 256ull << 20;
constexpr uint64_t kBlock = 64ull << 10;
constexpr int kBlocks = 1024;
constexpr int kKvSlots = 2 * kBlocks;  // the KV buffer has room for twice the blocks

void FillRandom(char* p, uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
}

double GBps(uint64_t bytes, uint64_t micros) {
  return micros == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(micros) / 1e3;
}

#define CHECK_OK(expr)                                                             \
  do {                                                                             \
    absl::Status s_ = (expr);                                                      \
    if (!s_.ok()) {                                                                \
      std::fprintf(stderr, "ferry-demo: %s: %s\n", #expr, s_.ToString().c_str()); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& v) {
  return v.status();
}

int Demo() {
  char tmpl[] = "/tmp/ferry-demo-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::string dir = tmpl;
  std::printf("ferry demo: agents node-a and node-b on loopback, mutual TLS between them (a "
              "throwaway CA in the work dir %s)\n",
              dir.c_str());

  auto port_a = PickFreePort(), port_b = PickFreePort();
  CHECK_OK(StatusOf(port_a));
  CHECK_OK(StatusOf(port_b));
  AgentSpec a{"node-a", dir, *port_a, {{"node-b", absl::StrFormat("127.0.0.1:%d", *port_b)}}};
  AgentSpec b{"node-b", dir, *port_b, {{"node-a", absl::StrFormat("127.0.0.1:%d", *port_a)}}};
  auto agent_a = AgentProcess::Start(a);
  CHECK_OK(StatusOf(agent_a));
  auto agent_b = AgentProcess::Start(b);
  CHECK_OK(StatusOf(agent_b));

  auto client_a = Client::Connect((*agent_a)->socket());
  auto client_b = Client::Connect((*agent_b)->socket());
  CHECK_OK(StatusOf(client_a));
  CHECK_OK(StatusOf(client_b));
  Client& ca = **client_a;
  Client& cb = **client_b;

  // 1. Bulk: 256 MiB of random bytes, node-a -> node-b.
  auto src = ca.Alloc(kBulk);
  auto dst = cb.Alloc(kBulk, "demo-bulk");
  CHECK_OK(StatusOf(src));
  CHECK_OK(StatusOf(dst));
  FillRandom((*src)->data(), kBulk, 42);
  const uint64_t src_sum = Checksum((*src)->data(), kBulk);
  auto bulk = ca.Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "demo-bulk", 0, kBulk}});
  CHECK_OK(StatusOf(bulk));
  CHECK_OK(TransferStatus(*bulk));
  const uint64_t landed_sum = Checksum((*dst)->data(), kBulk);

  // 2. KV-cache batch: 1024 blocks of 64 KiB, each to a scattered slot of node-b's KV buffer.
  auto kv = cb.Alloc(kKvSlots * kBlock, "demo-kv");
  CHECK_OK(StatusOf(kv));
  std::vector<int> slots(kKvSlots);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937(7));
  std::vector<OpSpec> kv_ops;
  for (int i = 0; i < kBlocks; ++i) {
    kv_ops.push_back({ferry::v1::WRITE, (*src)->id(),
                      static_cast<uint64_t>(i) * kBlock * 3 % (kBulk - kBlock), "node-b", "demo-kv",
                      static_cast<uint64_t>(slots[i]) * kBlock, kBlock});
  }
  auto kv_result = ca.Run(kv_ops, absl::Seconds(60), /*include_ops=*/true);
  CHECK_OK(StatusOf(kv_result));
  CHECK_OK(TransferStatus(*kv_result));

  // 3. Read both back into fresh node-a buffers, and compare.
  auto back = ca.Alloc(kBulk);
  CHECK_OK(StatusOf(back));
  std::vector<OpSpec> read_ops = {
      {ferry::v1::READ, (*back)->id(), 0, "node-b", "demo-bulk", 0, kBulk}};
  auto read_bulk = ca.Run(read_ops);
  CHECK_OK(StatusOf(read_bulk));
  CHECK_OK(TransferStatus(*read_bulk));
  const uint64_t back_sum = Checksum((*back)->data(), kBulk);

  auto kv_back = ca.Alloc(kBlocks * kBlock);
  CHECK_OK(StatusOf(kv_back));
  std::vector<OpSpec> kv_read;
  for (int i = 0; i < kBlocks; ++i) {
    kv_read.push_back({ferry::v1::READ, (*kv_back)->id(), static_cast<uint64_t>(i) * kBlock,
                       "node-b", "demo-kv", static_cast<uint64_t>(slots[i]) * kBlock, kBlock});
  }
  auto kv_read_result = ca.Run(kv_read);
  CHECK_OK(StatusOf(kv_read_result));
  CHECK_OK(TransferStatus(*kv_read_result));
  int kv_bad = 0;
  for (int i = 0; i < kBlocks; ++i) {
    const char* sent = (*src)->data() + kv_ops[i].local_offset;
    if (std::memcmp(sent, (*kv_back)->data() + i * kBlock, kBlock) != 0) ++kv_bad;
  }

  // Report.
  int ok_ops = 0;
  uint64_t max_us = 0, sum_us = 0;
  for (const auto& op : kv_result->ops()) {
    if (op.code() == 0) ++ok_ops;
    max_us = std::max<uint64_t>(max_us, op.duration_us());
    sum_us += op.duration_us();
  }
  bool bulk_ok = src_sum == landed_sum && src_sum == back_sum;
  std::printf("\n%-34s %12s %10s %8s  %s\n", "step", "bytes", "ms", "GB/s", "check");
  auto row = [](const char* step, uint64_t bytes, uint64_t us, bool ok) {
    std::printf("%-34s %12llu %10.1f %8.2f  %s\n", step, static_cast<unsigned long long>(bytes),
                us / 1e3, GBps(bytes, us), ok ? "ok" : "MISMATCH");
  };
  row("WRITE 256 MiB node-a -> node-b", bulk->bytes(), bulk->duration_us(), src_sum == landed_sum);
  row("WRITE KV 1024 x 64 KiB (scattered)", kv_result->bytes(), kv_result->duration_us(), true);
  row("READ  256 MiB node-b -> node-a", read_bulk->bytes(), read_bulk->duration_us(),
      src_sum == back_sum);
  row("READ  KV 1024 x 64 KiB (scattered)", kv_read_result->bytes(), kv_read_result->duration_us(),
      kv_bad == 0);
  std::printf("\nKV batch: %d/%d ops ok, provider %s, op latency mean %.2f ms, max %.2f ms\n",
              ok_ops, kv_result->ops_size(), kv_result->ops(0).provider().c_str(),
              sum_us / 1e3 / std::max(1, kv_result->ops_size()), max_us / 1e3);
  std::printf("checksums: source %016llx, landed on node-b %016llx, read back %016llx\n",
              static_cast<unsigned long long>(src_sum), static_cast<unsigned long long>(landed_sum),
              static_cast<unsigned long long>(back_sum));

  (*agent_a)->Stop();
  (*agent_b)->Stop();
  std::string cleanup = "rm -rf " + dir;
  if (std::system(cleanup.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
  bool ok = bulk_ok && kv_bad == 0 && ok_ops == kBlocks;
  std::printf("%s\n", ok ? "demo: all data verified" : "demo: DATA MISMATCH");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main() { return ferry::Demo(); }
