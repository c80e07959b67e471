// The tcp provider on its event loops: threads that do not grow with endpoints or
// connections, payloads far larger than a socket buffer (many partial sends and receives on
// both sides), small ops on the express connection (and spilling onto the bulk ones in a
// burst), a peer that leaves mid-op, and Close from inside a completion.

#include <dirent.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/completion_waiter.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/session_secrets.h"
#include "transport/tcp/tcp_endpoint.h"
#include "transport/tcp/tcp_fabric.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {
namespace {

using fabric::CompletionWaiter;
using fabric::Endpoint;

size_t ThreadCount() {
  size_t n = 0;
  DIR* dir = opendir("/proc/self/task");
  while (dir != nullptr) {
    dirent* entry = readdir(dir);
    if (entry == nullptr) break;
    if (entry->d_name[0] != '.') ++n;
  }
  if (dir != nullptr) closedir(dir);
  return n;
}

// The count once every thread that was joined has left /proc/self/task, with `expected` the
// most there should be: pthread_join returns as soon as the thread cleared its tid, a moment
// before the kernel takes its task away (bounded polling; the count as it is then).
size_t ThreadCountAtMost(size_t expected) {
  size_t n = ThreadCount();
  for (absl::Time give_up = absl::Now() + absl::Seconds(5); n > expected && absl::Now() < give_up;
       n = ThreadCount()) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return n;
}

// The count once no joined thread is still leaving: the same on three reads in a row.
size_t SettledThreadCount() {
  size_t n = ThreadCount();
  for (int same = 0, reads = 0; same < 3 && reads < 1000; ++reads) {
    absl::SleepFor(absl::Milliseconds(2));
    const size_t again = ThreadCount();
    same = again == n ? same + 1 : 0;
    n = again;
  }
  return n;
}

// Threads of a fabric: loops for each direction and the accept thread.
size_t FabricThreads(uint32_t loops) { return 2 * loops + 1; }

std::unique_ptr<TcpFabric> MakeFabric(uint32_t loops, uint32_t connections,
                                      uint64_t express_max_bytes = TcpOptions{}.express_max_bytes) {
  TcpOptions options;
  options.event_loops = loops;
  options.connections = connections;
  options.express_max_bytes = express_max_bytes;
  options.stripe_min_bytes = 64 << 10;
  options.max_connections_per_source = 1024;  // every endpoint here comes from 127.0.0.1
  auto fabric = TcpFabric::Create(options);
  EXPECT_TRUE(fabric.ok()) << fabric.status();
  return fabric.ok() ? std::move(*fabric) : nullptr;
}

void Fill(std::vector<char>& mem, uint64_t seed) {
  // 8 bytes at a time: 256 MiB must fill fast.
  for (size_t i = 0; i + 8 <= mem.size(); i += 8) {
    uint64_t v = (i + seed) * 0x9e3779b97f4a7c15ull;
    std::memcpy(mem.data() + i, &v, 8);
  }
}

// Counts completions; Wait returns once `expected` ran.
class Tally {
 public:
  explicit Tally(int expected) : expected_(expected) {}
  // Fewer ops were accepted than planned.
  void Expect(int expected) {
    absl::MutexLock lock(&mu_);
    expected_ = expected;
  }
  fabric::Completion Callback(int op) {
    return [this, op](absl::Status s) {
      absl::MutexLock lock(&mu_);
      ++calls_[op];
      if (!s.ok()) {
        ++failed_;
        if (!absl::IsUnavailable(s)) ++not_unavailable_;
      }
      ++done_;
    };
  }
  bool Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= expected_; };
    return mu_.AwaitWithTimeout(absl::Condition(&all), timeout);
  }
  int calls(int op) {
    absl::MutexLock lock(&mu_);
    return calls_[op];
  }
  int failed() {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  int not_unavailable() {
    absl::MutexLock lock(&mu_);
    return not_unavailable_;
  }

 private:
  absl::Mutex mu_;
  int expected_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> calls_ ABSL_GUARDED_BY(mu_);
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  int failed_ ABSL_GUARDED_BY(mu_) = 0;
  int not_unavailable_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(TcpEventLoopTest, SixtyFourEndpointsShareAFewLoopsAndMoveTheirBytes) {
  constexpr uint32_t kLoops = 2;
  constexpr int kEndpoints = 64;
  constexpr uint64_t kBlock = 256 << 10;  // striped over the 4 connections
  // A sanitizer runtime (TSan) starts a thread of its own at the first pthread_create: let
  // it start before counting ours.
  std::thread([] {}).join();
  const size_t before = SettledThreadCount();
  {
    auto target = MakeFabric(kLoops, 4);
    auto initiator = MakeFabric(kLoops, 4);
    ASSERT_TRUE(target && initiator);
    const size_t with_fabrics = ThreadCount();
    EXPECT_EQ(with_fabrics, before + 2 * FabricThreads(kLoops));

    std::vector<char> src(kEndpoints * kBlock), dst(kEndpoints * kBlock, 0),
        back(kEndpoints * kBlock, 0);
    Fill(src, 11);
    auto src_mr = initiator->Register(src.data(), src.size(), fabric::kLocal);
    auto back_mr = initiator->Register(back.data(), back.size(), fabric::kLocal);
    auto dst_mr =
        target->Register(dst.data(), dst.size(), fabric::kRemoteWrite | fabric::kRemoteRead);
    ASSERT_TRUE(src_mr.ok() && back_mr.ok() && dst_mr.ok());

    std::vector<std::shared_ptr<Endpoint>> endpoints;
    for (int i = 0; i < kEndpoints; ++i) {
      auto ep = fabric::ConnectDirect(*initiator, *target);
      ASSERT_TRUE(ep.ok()) << ep.status();
      endpoints.push_back(std::move(*ep));
    }
    // Every connection (4 bulk and the express one per endpoint) accepted and past its
    // hello, and still no thread more.
    constexpr uint32_t kSockets = kEndpoints * (4u + 1);
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (target->listener_stats().open < kSockets && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(target->listener_stats().open, kSockets);

    // WRITEs from every endpoint at once, posted from four threads; then READs back.
    for (bool read : {false, true}) {
      Tally tally(kEndpoints);
      std::vector<std::thread> posters;
      for (int t = 0; t < 4; ++t) {
        posters.emplace_back([&, t] {
          for (int i = t; i < kEndpoints; i += 4) {
            fabric::RemoteSlice remote = {(*dst_mr)->remote_address() + i * kBlock,
                                          (*dst_mr)->key()};
            absl::Status s = read ? endpoints[i]->PostRead({back_mr->get(), i * kBlock, kBlock},
                                                           remote, tally.Callback(i))
                                  : endpoints[i]->PostWrite({src_mr->get(), i * kBlock, kBlock},
                                                            remote, tally.Callback(i));
            EXPECT_TRUE(s.ok()) << s;
          }
        });
      }
      for (auto& p : posters) p.join();
      ASSERT_TRUE(tally.Wait(absl::Seconds(60)));
      EXPECT_EQ(tally.failed(), 0);
      for (int i = 0; i < kEndpoints; ++i) EXPECT_EQ(tally.calls(i), 1) << i;
    }
    EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), src.size()));
    EXPECT_EQ(0, std::memcmp(src.data(), back.data(), src.size()));

    // 64 endpoints, 256 connections each way: the same threads as with none.
    const size_t with_endpoints = ThreadCountAtMost(with_fabrics);  // the posters joined
    EXPECT_EQ(with_endpoints, with_fabrics);
    EXPECT_LT(with_endpoints, before + 4 * kLoops + 8);
    std::printf(
        "threads: %zu before, %zu with two fabrics (%u loops each way), %zu with %d "
        "endpoints of 4 connections\n",
        before, with_fabrics, kLoops, with_endpoints, kEndpoints);

    for (auto& ep : endpoints) ep->Close();
    endpoints.clear();
    src_mr->reset();
    back_mr->reset();
    dst_mr->reset();
  }
  EXPECT_EQ(ThreadCountAtMost(before), before) << "fabric threads outlived their fabric";
}

TEST(TcpEventLoopTest, AQuarterGibibyteWriteAndReadSpanManyPartialSends) {
  constexpr uint64_t kSize = 256ull << 20;
  // One connection: the op is not striped, so one socket carries it in many partial
  // sendmsg/recv calls on both sides, with the target's pin held across all of them.
  auto target = MakeFabric(2, 1);
  auto initiator = MakeFabric(2, 1);
  ASSERT_TRUE(target && initiator);
  std::vector<char> src(kSize + 8), dst(kSize + 8, 0), back(kSize + 8, 0);
  Fill(src, 5);
  auto src_mr = initiator->Register(src.data(), src.size(), fabric::kLocal);
  auto back_mr = initiator->Register(back.data(), back.size(), fabric::kLocal);
  auto dst_mr =
      target->Register(dst.data(), dst.size(), fabric::kRemoteWrite | fabric::kRemoteRead);
  ASSERT_TRUE(src_mr.ok() && back_mr.ok() && dst_mr.ok());
  auto ep = fabric::ConnectDirect(*initiator, *target);
  ASSERT_TRUE(ep.ok()) << ep.status();

  CompletionWaiter w;
  ASSERT_TRUE((*ep)
                  ->PostWrite({src_mr->get(), 3, kSize},
                              {(*dst_mr)->remote_address() + 5, (*dst_mr)->key()}, w.Callback())
                  .ok());
  ASSERT_TRUE(w.Wait().ok()) << w.Wait();
  EXPECT_EQ(0, std::memcmp(src.data() + 3, dst.data() + 5, kSize));
  EXPECT_EQ(dst[4], 0);
  EXPECT_EQ(dst[kSize + 5], 0);

  CompletionWaiter r;
  ASSERT_TRUE((*ep)
                  ->PostRead({back_mr->get(), 1, kSize},
                             {(*dst_mr)->remote_address() + 5, (*dst_mr)->key()}, r.Callback())
                  .ok());
  ASSERT_TRUE(r.Wait().ok()) << r.Wait();
  EXPECT_EQ(0, std::memcmp(src.data() + 3, back.data() + 1, kSize));
  EXPECT_EQ(back[0], 0);
  EXPECT_EQ(back[kSize + 1], 0);
  EXPECT_EQ(w.calls() + r.calls(), 2);
  (*ep)->Close();
}

// Two fabrics with the express connection as asked, `size` filled bytes to WRITE from and
// as many zeros to WRITE into, and one endpoint between them.
struct WritePair {
  std::unique_ptr<TcpFabric> target, initiator;
  std::vector<char> src, dst;
  std::unique_ptr<fabric::MemoryRegion> src_mr, dst_mr;
  std::shared_ptr<Endpoint> ep;
  TcpEndpoint* tcp = nullptr;

  // The source slice of `length` bytes at `at`, and the destination at the same offset.
  fabric::LocalSlice from(uint64_t at, uint64_t length) const {
    return {src_mr.get(), at, length};
  }
  fabric::RemoteSlice to(uint64_t at) const {
    return {dst_mr->remote_address() + at, dst_mr->key()};
  }
  // Once every op `tally` counts has completed: none failed, every byte landed, and no
  // socket counts bytes any more. Then closes the endpoint.
  void ExpectAllLanded(Tally& tally) {
    ASSERT_TRUE(tally.Wait(absl::Seconds(60)));
    EXPECT_EQ(tally.failed(), 0);
    EXPECT_EQ(src, dst);
    for (const auto& s : tcp->socket_counts()) EXPECT_EQ(s.load_bytes, 0u) << "bytes counted";
    ep->Close();
  }
};

absl::StatusOr<std::unique_ptr<WritePair>> MakeWritePair(uint64_t size, uint64_t express) {
  auto pair = std::make_unique<WritePair>();
  pair->target = MakeFabric(2, 4, express);
  pair->initiator = MakeFabric(2, 4, express);
  if (!pair->target || !pair->initiator) return absl::InternalError("no fabric");
  pair->src.resize(size);
  pair->dst.assign(size, 0);
  Fill(pair->src, size);
  auto src_mr = pair->initiator->Register(pair->src.data(), size, fabric::kLocal);
  auto dst_mr = pair->target->Register(pair->dst.data(), size, fabric::kRemoteWrite);
  if (!src_mr.ok()) return src_mr.status();
  if (!dst_mr.ok()) return dst_mr.status();
  pair->src_mr = std::move(*src_mr);
  pair->dst_mr = std::move(*dst_mr);
  auto ep = fabric::ConnectDirect(*pair->initiator, *pair->target);
  if (!ep.ok()) return ep.status();
  pair->ep = std::move(*ep);
  pair->tcp = dynamic_cast<TcpEndpoint*>(pair->ep.get());
  if (pair->tcp == nullptr) return absl::InternalError("not a tcp endpoint");
  return pair;
}

// Which socket each op takes is decided when it is posted: counted there, it does not depend
// on how fast the bytes move (how long a small op waits beside bulk ones is measured by
// `ferry-bench --suite fairness`, not here).
TEST(TcpEventLoopTest, SmallOpsTakeTheExpressConnectionAndLargerOnesTheBulkOnes) {
  constexpr uint64_t kBulkOp = 4 << 20, kExpress = 64 << 10;
  // Bulk, then the largest express op, a 4 KiB one, and one just over (not striped either:
  // under 2 x stripe_min_bytes, 64 KiB here).
  const std::vector<uint64_t> sizes = {kBulkOp, kBulkOp, kBulkOp, kBulkOp,
                                       kExpress, 4 << 10, kBulkOp, kExpress + (4 << 10)};
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  for (uint64_t express : {kExpress, uint64_t{0}}) {
    auto pair = MakeWritePair(total, express);
    ASSERT_TRUE(pair.ok()) << pair.status();
    WritePair& p = **pair;
    Tally tally(static_cast<int>(sizes.size()));
    uint64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_TRUE(p.ep->PostWrite(p.from(at, sizes[i]), p.to(at),
                                  tally.Callback(static_cast<int>(i))).ok());
      at += sizes[i];
    }
    // 5 bulk ops striped in 4 parts each, and the one over 64 KiB: 21 requests on the bulk
    // sockets; the two small ones on the express socket, or on the bulk ones without it.
    const auto sockets = p.tcp->socket_counts();
    uint64_t on_bulk = 0;
    for (size_t i = 0; i < 4; ++i) on_bulk += sockets[i].ops_queued;
    if (express > 0) {
      ASSERT_EQ(sockets.size(), 5u);
      EXPECT_EQ(on_bulk, 21u);
      EXPECT_EQ(sockets.back().ops_queued, 2u);
    } else {
      ASSERT_EQ(sockets.size(), 4u);
      EXPECT_EQ(on_bulk, 23u);
    }
    p.ExpectAllLanded(tally);
  }
}

TEST(TcpEventLoopTest, TheExpressConnectionIsOneMoreSocketAndOptional) {
  for (uint64_t express : {TcpOptions{}.express_max_bytes, uint64_t{0}}) {
    auto target = MakeFabric(1, 3, express);
    auto initiator = MakeFabric(1, 3, express);
    ASSERT_TRUE(target && initiator);
    auto ep = fabric::ConnectDirect(*initiator, *target);
    ASSERT_TRUE(ep.ok()) << ep.status();
    const uint32_t sockets = express > 0 ? 4 : 3;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (target->listener_stats().open < sockets && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    absl::SleepFor(absl::Milliseconds(20));  // none more comes
    EXPECT_EQ(target->listener_stats().open, sockets) << "express_max_bytes " << express;
    (*ep)->Close();
  }
}

TEST(TcpEventLoopTest, ABurstOfSmallOpsSpillsFromTheExpressConnectionAndLoadsReturnToZero) {
  constexpr int kOps = 64;
  constexpr uint64_t kOp = 64 << 10;  // the largest express op: 4 MiB in all
  auto pair = MakeWritePair(kOps * kOp, TcpOptions{}.express_max_bytes);
  ASSERT_TRUE(pair.ok()) << pair.status();
  WritePair& p = **pair;
  Tally tally(kOps);
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(p.ep->PostWrite(p.from(i * kOp, kOp), p.to(i * kOp), tally.Callback(i)).ok());
  }
  // Loads only fall while ops complete: the express socket took ops until it held 512 KiB,
  // the bulk ones the rest (all 4 MiB on one socket would be far over).
  const auto sockets = p.tcp->socket_counts();
  ASSERT_EQ(sockets.size(), 5u);
  EXPECT_LT(sockets.back().load_bytes, (512u << 10) + kOp);
  p.ExpectAllLanded(tally);
}

TEST(TcpEventLoopTest, APeerLeavingMidOpFailsEveryOutstandingOpUnavailableOnce) {
  // A fake target: takes the hello and part of the first payload, then hangs up.
  uint16_t port = 0;
  auto listener = ListenTcp("127.0.0.1:0", &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::Notification posted;
  std::thread peer([&] {
    UniqueFd conn(accept(listener->get(), nullptr, nullptr));
    if (!conn.valid()) return;
    posted.WaitForNotification();  // every op is outstanding when it leaves
    std::vector<char> some(sizeof(RequestHeader) * 2 + (300 << 10));
    RecvAll(conn.get(), some.data(), some.size()).IgnoreError();
  });
  auto initiator = MakeFabric(2, 1);
  ASSERT_TRUE(initiator);
  auto pending = initiator->BeginConnect(absl::StrCat("127.0.0.1:", port));
  ASSERT_TRUE(pending.ok());
  // The fake target admits anyone: any well-formed session will do.
  auto ep = (*pending)->Finish(EncodeSessionReply({1, {}}));
  ASSERT_TRUE(ep.ok()) << ep.status();

  constexpr int kOps = 32;
  constexpr uint64_t kBlock = 1 << 20;
  std::vector<char> src(kBlock, 'p'), back(kBlock, 0);
  auto src_mr = initiator->Register(src.data(), src.size(), fabric::kLocal);
  auto back_mr = initiator->Register(back.data(), back.size(), fabric::kLocal);
  ASSERT_TRUE(src_mr.ok() && back_mr.ok());
  Tally tally(kOps);
  for (int i = 0; i < kOps; ++i) {
    absl::Status s =
        i % 2 == 0 ? (*ep)->PostWrite({src_mr->get(), 0, kBlock}, {0x1000, 7}, tally.Callback(i))
                   : (*ep)->PostRead({back_mr->get(), 0, kBlock}, {0x1000, 7}, tally.Callback(i));
    EXPECT_TRUE(s.ok()) << s;
  }
  posted.Notify();
  peer.join();
  ASSERT_TRUE(tally.Wait(absl::Seconds(30)));
  EXPECT_EQ(tally.failed(), kOps);
  EXPECT_EQ(tally.not_unavailable(), 0);
  for (int i = 0; i < kOps; ++i) EXPECT_EQ(tally.calls(i), 1) << i;
  EXPECT_TRUE((*ep)->broken());
  EXPECT_EQ((*ep)
                ->PostWrite({src_mr->get(), 0, 1}, {0x1000, 7},
                            [](absl::Status) { ADD_FAILURE() << "ran"; })
                .code(),
            absl::StatusCode::kUnavailable);
  (*ep)->Close();
  absl::SleepFor(absl::Milliseconds(50));
  for (int i = 0; i < kOps; ++i) EXPECT_EQ(tally.calls(i), 1) << i;
}

TEST(TcpEventLoopTest, StopServingMidTransferFailsThePeersOpsAndKeepsOurEndpoints) {
  auto a = MakeFabric(2, 4);
  auto b = MakeFabric(2, 4);
  ASSERT_TRUE(a && b);
  constexpr int kOps = 64;
  constexpr uint64_t kBlock = 4 << 20;
  std::vector<char> src(kBlock, 's'), dst(kBlock, 0), mine(kBlock, 0);
  auto src_mr = a->Register(src.data(), src.size(), fabric::kLocal);
  auto dst_mr = b->Register(dst.data(), dst.size(), fabric::kRemoteWrite);
  auto mine_mr = a->Register(mine.data(), mine.size(), fabric::kRemoteWrite);
  auto b_src = b->Register(dst.data(), dst.size(), fabric::kLocal);
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok() && mine_mr.ok() && b_src.ok());
  auto a_to_b = fabric::ConnectDirect(*a, *b);
  auto b_to_a = fabric::ConnectDirect(*b, *a);
  ASSERT_TRUE(a_to_b.ok() && b_to_a.ok());
  Tally tally(kOps);
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE((*a_to_b)
                    ->PostWrite({src_mr->get(), 0, kBlock},
                                {(*dst_mr)->remote_address(), (*dst_mr)->key()}, tally.Callback(i))
                    .ok());
  }
  b->StopServing();
  EXPECT_EQ(b->listener_stats().open, 0u) << "StopServing returned with connections open";
  ASSERT_TRUE(tally.Wait(absl::Seconds(30)));
  EXPECT_EQ(tally.not_unavailable(), 0);
  EXPECT_GT(tally.failed(), 0);
  for (int i = 0; i < kOps; ++i) EXPECT_EQ(tally.calls(i), 1) << i;
  // b's own endpoint to a still works.
  CompletionWaiter w;
  ASSERT_TRUE((*b_to_a)
                  ->PostWrite({b_src->get(), 0, kBlock},
                              {(*mine_mr)->remote_address(), (*mine_mr)->key()}, w.Callback())
                  .ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  (*a_to_b)->Close();
  (*b_to_a)->Close();
}

TEST(TcpEventLoopTest, CloseFromInsideACompletionDoesNotDeadlock) {
  auto target = MakeFabric(2, 4);
  auto initiator = MakeFabric(2, 4);
  ASSERT_TRUE(target && initiator);
  constexpr int kOps = 256;
  constexpr uint64_t kBlock = 64 << 10;
  // Each op lands in its own block: overlapping WRITEs from several connections are
  // unordered by the fabric contract, and TSan (make test-tsan) rightly calls them a race.
  std::vector<char> src(kBlock, 'c'), dst(kOps * kBlock, 0);
  auto src_mr = initiator->Register(src.data(), src.size(), fabric::kLocal);
  auto dst_mr = target->Register(dst.data(), dst.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  for (bool drop_last_reference : {false, true}) {
    auto ep = fabric::ConnectDirect(*initiator, *target);
    ASSERT_TRUE(ep.ok()) << ep.status();
    std::shared_ptr<Endpoint> endpoint = *ep;
    std::shared_ptr<Endpoint> held = endpoint;  // what the completion closes or drops
    absl::Notification closed;
    Tally tally(kOps);
    std::atomic<bool> first{true};
    int accepted = 0;
    for (int i = 0; i < kOps; ++i) {
      auto count = tally.Callback(i);
      absl::Status s = endpoint->PostWrite(
          {src_mr->get(), 0, kBlock},
          {(*dst_mr)->remote_address() + i * kBlock, (*dst_mr)->key()},
          [&, count = std::move(count)](absl::Status status) mutable {
            if (first.exchange(false)) {
              // On a loop thread, with this connection's other completions still to run.
              if (drop_last_reference) {
                held.reset();  // the destructor closes it
              } else {
                held->Close();
              }
              closed.Notify();
            }
            std::move(count)(std::move(status));
          });
      // Once the completion closed it, the endpoint refuses posts (and their completions
      // never run).
      if (!s.ok()) {
        EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
        break;
      }
      ++accepted;
    }
    tally.Expect(accepted);
    if (drop_last_reference) endpoint.reset();
    ASSERT_TRUE(closed.WaitForNotificationWithTimeout(absl::Seconds(30))) << "no completion ran";
    ASSERT_TRUE(tally.Wait(absl::Seconds(30))) << "Close in a completion left ops unfinished";
    EXPECT_EQ(tally.not_unavailable(), 0);
    for (int i = 0; i < accepted; ++i) EXPECT_EQ(tally.calls(i), 1) << i;
    for (int i = accepted; i < kOps; ++i) EXPECT_EQ(tally.calls(i), 0) << i;
    if (endpoint) {
      EXPECT_TRUE(endpoint->broken());
      endpoint->Close();
    }
  }
}

}  // namespace
}  // namespace ferry::tcp
