// The fake fabric's own strictness: every refusal the real providers make, completions exactly
// once on the fabric's thread, Close and region revocation as transport/fabric.h promises,
// and the fault-injection knobs other tests rely on.

#include "tests/fakes/fake_fabric.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/completion_waiter.h"

namespace ferry::fake {
namespace {

using fabric::ConnectDirect;
using fabric::Endpoint;
using fabric::kLocal;
using fabric::kRemoteRead;
using fabric::kRemoteWrite;
using fabric::MemoryRegion;
using Waiter = fabric::CompletionWaiter;

constexpr absl::Duration kWait = absl::Seconds(10);

// Records how, and on which thread, an op completed.
class Recorder {
 public:
  fabric::Completion Callback() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu_);
      statuses_.push_back(std::move(s));
      threads_.push_back(std::this_thread::get_id());
    };
  }
  bool AwaitCount(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return statuses_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
  }
  std::vector<absl::Status> statuses() const {
    absl::MutexLock lock(&mu_);
    return statuses_;
  }
  std::vector<std::thread::id> threads() const {
    absl::MutexLock lock(&mu_);
    return threads_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<absl::Status> statuses_;
  std::vector<std::thread::id> threads_;
};

class FakeFabricTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeFabric::ClearContractViolations();
    Connect();
  }
  void TearDown() override {
    if (endpoint_) endpoint_->Close();
    endpoint_.reset();
    EXPECT_TRUE(FakeFabric::ContractViolations().empty())
        << FakeFabric::ContractViolations().front();
  }

  void Connect() {
    auto ep = ConnectDirect(initiator_, target_);
    ASSERT_TRUE(ep.ok()) << ep.status();
    endpoint_ = std::move(*ep);
  }

  std::unique_ptr<MemoryRegion> Register(FakeFabric& fabric, std::vector<char>& mem,
                                         uint32_t access) {
    auto r = fabric.Register(mem.data(), mem.size(), access);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }

  static fabric::RemoteSlice At(const MemoryRegion& r, uint64_t offset = 0) {
    return {r.remote_address() + offset, r.key()};
  }

  FakeFabric initiator_;
  FakeFabric target_;
  std::shared_ptr<Endpoint> endpoint_;
};

TEST_F(FakeFabricTest, WriteAndReadMoveTheBytesAndAreCounted) {
  std::vector<char> src(4096), dst(4096 + 16, 0), back(4096, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7);
  auto src_mr = Register(initiator_, src, kLocal);
  auto back_mr = Register(initiator_, back, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite | kRemoteRead);
  Waiter w;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 4096}, At(*dst_mr, 8), w.Callback()).ok());
  ASSERT_TRUE(w.Wait().ok()) << w.Wait();
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data() + 8, 4096));
  EXPECT_EQ(0, dst[7]);
  EXPECT_EQ(0, dst[8 + 4096]);
  Waiter r;
  ASSERT_TRUE(endpoint_->PostRead({back_mr.get(), 0, 4096}, At(*dst_mr, 8), r.Callback()).ok());
  ASSERT_TRUE(r.Wait().ok()) << r.Wait();
  EXPECT_EQ(src, back);

  ASSERT_TRUE(initiator_.AwaitIdle(kWait));
  FakeFabricStats i = initiator_.stats(), t = target_.stats();
  EXPECT_EQ(i.posts, 2u);
  EXPECT_EQ(i.completions, 2u);
  EXPECT_EQ(i.failed_completions, 0u);
  EXPECT_EQ(i.outstanding, 0u);
  EXPECT_EQ(i.bytes_written, 4096u);
  EXPECT_EQ(i.bytes_read, 4096u);
  EXPECT_EQ(i.live_regions, 2u);
  EXPECT_EQ(i.live_endpoints, 1u);
  EXPECT_EQ(t.remote_accesses, 2u);
  EXPECT_EQ(t.incoming_endpoints, 1u);
  EXPECT_EQ(t.registrations, 1u);
}

TEST_F(FakeFabricTest, CompletionsRunOnTheFabricThreadWithNoLockHeld) {
  std::vector<char> src(64, 's'), dst(64, 0), more(64, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  std::thread::id first_thread, nested_thread;
  absl::Notification nested_done;
  Waiter w;
  // The completion calls back into both fabrics (stats, Register, Post): were it run under a
  // lock of the fake, this would deadlock.
  ASSERT_TRUE(endpoint_
                  ->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr),
                              [&](absl::Status s) {
                                first_thread = std::this_thread::get_id();
                                (void)initiator_.stats();
                                (void)target_.stats();
                                auto extra =
                                    target_.Register(more.data(), more.size(), kRemoteWrite);
                                EXPECT_TRUE(extra.ok());
                                EXPECT_TRUE(endpoint_
                                                ->PostWrite({src_mr.get(), 0, 8}, At(*dst_mr, 8),
                                                            [&](absl::Status) {
                                                              nested_thread =
                                                                  std::this_thread::get_id();
                                                              nested_done.Notify();
                                                            })
                                                .ok());
                                w.Callback()(std::move(s));
                              })
                  .ok());
  ASSERT_TRUE(w.Wait().ok());
  ASSERT_TRUE(nested_done.WaitForNotificationWithTimeout(kWait));
  EXPECT_NE(first_thread, std::this_thread::get_id());
  EXPECT_EQ(first_thread, nested_thread) << "one completion thread per fabric";
}

TEST_F(FakeFabricTest, UnknownAndRevokedKeysArePermissionDeniedAndMemoryUntouched) {
  std::vector<char> src(256, 'x'), dst(256, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite | kRemoteRead);
  Waiter bad_key;
  ASSERT_TRUE(endpoint_
                  ->PostWrite({src_mr.get(), 0, 256},
                              {dst_mr->remote_address(), dst_mr->key() ^ 0x5a5a},
                              bad_key.Callback())
                  .ok());
  EXPECT_EQ(bad_key.Wait().code(), absl::StatusCode::kPermissionDenied) << bad_key.Wait();
  // A key of the initiator's own fabric names nothing on the target.
  Waiter foreign_key;
  ASSERT_TRUE(
      endpoint_->PostWrite({src_mr.get(), 0, 256}, At(*src_mr), foreign_key.Callback()).ok());
  EXPECT_EQ(foreign_key.Wait().code(), absl::StatusCode::kPermissionDenied);

  fabric::RemoteSlice where = At(*dst_mr);
  dst_mr.reset();  // revokes the key
  Waiter revoked;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 256}, where, revoked.Callback()).ok());
  EXPECT_EQ(revoked.Wait().code(), absl::StatusCode::kPermissionDenied) << revoked.Wait();
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 256);
  // tcp-like by default: a refusal leaves the endpoint usable.
  EXPECT_FALSE(endpoint_->broken());
  EXPECT_EQ(target_.stats().remote_refusals, 3u);
}

TEST_F(FakeFabricTest, RangesOutsideTheRegionAreOutOfRange) {
  std::vector<char> src(8192, 'x'), dst(8192, 0), back(8192, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto back_mr = Register(initiator_, back, kLocal);
  auto dst_mr = target_.Register(dst.data(), 4096, kRemoteWrite | kRemoteRead);
  ASSERT_TRUE(dst_mr.ok());
  const MemoryRegion& d = **dst_mr;
  struct Case {
    uint64_t address;
    uint64_t length;
  };
  for (Case c :
       {Case{d.remote_address() + 4000, 200}, Case{d.remote_address() + 4096, 1},
        Case{d.remote_address(), 4097}, Case{d.remote_address() - 1, 1}, Case{~0ull - 2, 8}}) {
    Waiter w;
    ASSERT_TRUE(
        endpoint_->PostWrite({src_mr.get(), 0, c.length}, {c.address, d.key()}, w.Callback()).ok());
    EXPECT_EQ(w.Wait().code(), absl::StatusCode::kOutOfRange) << c.address << "+" << c.length;
    Waiter r;
    ASSERT_TRUE(
        endpoint_->PostRead({back_mr.get(), 0, c.length}, {c.address, d.key()}, r.Callback()).ok());
    EXPECT_EQ(r.Wait().code(), absl::StatusCode::kOutOfRange);
  }
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 8192);
  EXPECT_EQ(std::count(back.begin(), back.end(), 0), 8192);
  // The last byte is inside.
  Waiter last;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 1}, At(d, 4095), last.Callback()).ok());
  EXPECT_TRUE(last.Wait().ok()) << last.Wait();
}

TEST_F(FakeFabricTest, RemoteAddressIsNotTheVirtualAddress) {
  std::vector<char> src(64, 'v'), dst(64, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  EXPECT_NE(dst_mr->remote_address(), reinterpret_cast<uint64_t>(dst.data()));
  Waiter w;
  ASSERT_TRUE(endpoint_
                  ->PostWrite({src_mr.get(), 0, 64},
                              {reinterpret_cast<uint64_t>(dst.data()), dst_mr->key()}, w.Callback())
                  .ok());
  EXPECT_EQ(w.Wait().code(), absl::StatusCode::kOutOfRange) << "a local pointer is no address";
}

TEST_F(FakeFabricTest, AccessFlagsAreEnforced) {
  std::vector<char> src(64, 'x'), back(64, 0), read_only(64, 0), write_only(64, 's'),
      local_only(64, 'l');
  auto src_mr = Register(initiator_, src, kLocal);
  auto back_mr = Register(initiator_, back, kLocal);
  auto ro = Register(target_, read_only, kRemoteRead);
  auto wo = Register(target_, write_only, kRemoteWrite);
  auto lo = Register(target_, local_only, kLocal);
  for (const MemoryRegion* r : {ro.get(), lo.get()}) {
    Waiter w;
    ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*r), w.Callback()).ok());
    EXPECT_EQ(w.Wait().code(), absl::StatusCode::kPermissionDenied) << w.Wait();
  }
  for (const MemoryRegion* r : {wo.get(), lo.get()}) {
    Waiter w;
    ASSERT_TRUE(endpoint_->PostRead({back_mr.get(), 0, 64}, At(*r), w.Callback()).ok());
    EXPECT_EQ(w.Wait().code(), absl::StatusCode::kPermissionDenied) << w.Wait();
  }
  EXPECT_EQ(std::count(read_only.begin(), read_only.end(), 0), 64);
  EXPECT_EQ(std::count(local_only.begin(), local_only.end(), 'l'), 64);
  EXPECT_EQ(std::count(back.begin(), back.end(), 0), 64);
}

TEST_F(FakeFabricTest, BadLocalSlicesAreRefusedAtPost) {
  std::vector<char> src(64), dst(64), other(64);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  auto target_local = Register(target_, other, kLocal);  // registered, but not with us
  struct Case {
    fabric::LocalSlice slice;
    absl::StatusCode code;
  };
  bool ran = false;
  for (Case c : {Case{{nullptr, 0, 8}, absl::StatusCode::kOutOfRange},
                 Case{{src_mr.get(), 60, 8}, absl::StatusCode::kOutOfRange},
                 Case{{src_mr.get(), 65, 0}, absl::StatusCode::kOutOfRange},
                 Case{{src_mr.get(), 0, 0}, absl::StatusCode::kOutOfRange},
                 Case{{src_mr.get(), 8, ~0ull}, absl::StatusCode::kOutOfRange},
                 Case{{target_local.get(), 0, 8}, absl::StatusCode::kInvalidArgument}}) {
    EXPECT_EQ(endpoint_->PostWrite(c.slice, At(*dst_mr), [&](absl::Status) { ran = true; }).code(),
              c.code);
    EXPECT_EQ(endpoint_->PostRead(c.slice, At(*dst_mr), [&](absl::Status) { ran = true; }).code(),
              c.code);
  }
  EXPECT_FALSE(ran);
  FakeFabricStats s = initiator_.stats();
  EXPECT_EQ(s.posts, 0u);
  EXPECT_EQ(s.refused_posts, 12u);
}

TEST_F(FakeFabricTest, RegisterRefusesWhatIbvRegMrRefuses) {
  std::vector<char> mem(64);
  EXPECT_EQ(initiator_.Register(nullptr, 64, kLocal).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(initiator_.Register(mem.data(), 0, kLocal).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(initiator_.Register(mem.data(), 64, 1u << 7).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(initiator_.Register(mem.data(), ~0ull, kLocal).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(initiator_.stats().live_regions, 0u);
}

TEST_F(FakeFabricTest, KeysAreRandomNonZeroAndUnique) {
  std::vector<char> mem(64);
  std::vector<std::unique_ptr<MemoryRegion>> regions;
  std::set<uint32_t> keys;
  int consecutive = 0;
  for (int i = 0; i < 64; ++i) {
    regions.push_back(Register(target_, mem, kRemoteWrite));
    uint32_t key = regions.back()->key();
    EXPECT_NE(key, 0u);
    if (i > 0 && key == regions[i - 1]->key() + 1) ++consecutive;
    keys.insert(key);
  }
  EXPECT_EQ(keys.size(), 64u);
  EXPECT_LT(consecutive, 4) << "keys look sequential";
  EXPECT_EQ(target_.stats().live_regions, 64u);
  regions.clear();
  EXPECT_EQ(target_.stats().live_regions, 0u);
  EXPECT_EQ(target_.stats().registrations, 64u);
}

TEST_F(FakeFabricTest, ClosedEndpointRefusesPostsUnavailable) {
  std::vector<char> src(64), dst(64);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  endpoint_->Close();
  endpoint_->Close();  // idempotent
  EXPECT_TRUE(endpoint_->broken());
  bool ran = false;
  EXPECT_EQ(
      endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), [&](absl::Status) { ran = true; })
          .code(),
      absl::StatusCode::kUnavailable);
  EXPECT_FALSE(ran);
  EXPECT_EQ(initiator_.stats().live_endpoints, 0u);
  EXPECT_EQ(target_.stats().incoming_endpoints, 0u);
}

TEST_F(FakeFabricTest, CloseFailsHeldOpsOnceAndReturnsAfterTheirCompletions) {
  constexpr int kOps = 100;
  std::vector<char> src(64, 'h'), dst(64, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  initiator_.HoldCompletions();
  std::vector<std::atomic<int>> calls(kOps);
  std::atomic<int> unavailable{0};
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(endpoint_
                    ->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr),
                                [&, i](absl::Status s) {
                                  calls[i].fetch_add(1);
                                  if (absl::IsUnavailable(s)) unavailable.fetch_add(1);
                                })
                    .ok());
  }
  ASSERT_TRUE(initiator_.AwaitHeld(kOps, kWait));
  EXPECT_EQ(initiator_.stats().held, static_cast<uint64_t>(kOps));
  endpoint_->Close();
  for (int i = 0; i < kOps; ++i) EXPECT_EQ(calls[i].load(), 1) << i;
  EXPECT_EQ(unavailable.load(), kOps);
  initiator_.ReleaseCompletions();
  ASSERT_TRUE(initiator_.AwaitIdle(kWait));
  for (int i = 0; i < kOps; ++i) EXPECT_EQ(calls[i].load(), 1) << i;
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 64) << "a failed op touched memory";
}

TEST_F(FakeFabricTest, HeldOpsMoveNothingUntilReleased) {
  std::vector<char> src(64, 'r'), dst(64, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  initiator_.HoldCompletions();
  Waiter w;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), w.Callback()).ok());
  ASSERT_TRUE(initiator_.AwaitHeld(1, kWait));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(w.calls(), 0);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 64);
  EXPECT_FALSE(initiator_.AwaitIdle(absl::Milliseconds(1)));
  initiator_.ReleaseCompletions();
  EXPECT_TRUE(w.Wait().ok());
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 'r'), 64);
}

TEST_F(FakeFabricTest, CloseFromACompletionDoesNotWaitForItself) {
  std::vector<char> src(64), dst(64);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  initiator_.HoldCompletions();
  Recorder second;
  absl::Notification first_done;
  std::thread::id closer;
  // The first completion closes its endpoint and drops the last reference to it: the second
  // op, still waiting, fails UNAVAILABLE, on the same thread, before Close returns.
  ASSERT_TRUE(endpoint_
                  ->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr),
                              [&](absl::Status s) {
                                EXPECT_TRUE(s.ok()) << s;
                                closer = std::this_thread::get_id();
                                endpoint_->Close();
                                EXPECT_EQ(second.statuses().size(), 1u);
                                endpoint_.reset();
                                first_done.Notify();
                              })
                  .ok());
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), second.Callback()).ok());
  // Release one op only: the second stays queued behind the first.
  initiator_.ReleaseCompletions();
  ASSERT_TRUE(first_done.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(second.AwaitCount(1));
  auto statuses = second.statuses();
  ASSERT_EQ(statuses.size(), 1u);
  // Queued behind the first, it was failed by the close, on the completion thread.
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kUnavailable) << statuses[0];
  EXPECT_EQ(second.threads()[0], closer);
  ASSERT_TRUE(initiator_.AwaitIdle(kWait));
  EXPECT_EQ(initiator_.stats().live_endpoints, 0u);
}

TEST_F(FakeFabricTest, FailNextOpsCompletesThemWithTheStatusAndTouchesNothing) {
  std::vector<char> src(64, 'f'), dst(64, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  initiator_.FailNextOps(2, absl::DataLossError("injected"));
  Waiter a, b, c;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), a.Callback()).ok());
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), b.Callback()).ok());
  EXPECT_EQ(a.Wait().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(b.Wait().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 64);
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), c.Callback()).ok());
  EXPECT_TRUE(c.Wait().ok());
  EXPECT_EQ(initiator_.stats().failed_completions, 2u);
}

TEST_F(FakeFabricTest, RefuseNextPostsReturnsTheStatusNow) {
  std::vector<char> src(64), dst(64);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  initiator_.RefuseNextPosts(1, absl::ResourceExhaustedError("queue full"));
  bool ran = false;
  EXPECT_EQ(
      endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), [&](absl::Status) { ran = true; })
          .code(),
      absl::StatusCode::kResourceExhausted);
  Waiter w;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), w.Callback()).ok());
  EXPECT_TRUE(w.Wait().ok());
  EXPECT_FALSE(ran);
}

TEST_F(FakeFabricTest, MaxOutstandingIsBackPressure) {
  FakeFabric bounded({.max_outstanding = 2});
  auto ep = ConnectDirect(bounded, target_);
  ASSERT_TRUE(ep.ok());
  std::vector<char> src(64), dst(64);
  auto src_mr = Register(bounded, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  bounded.HoldCompletions();
  Waiter a, b;
  ASSERT_TRUE((*ep)->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), a.Callback()).ok());
  ASSERT_TRUE((*ep)->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), b.Callback()).ok());
  EXPECT_EQ((*ep)
                ->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr),
                            [](absl::Status) { ADD_FAILURE() << "ran"; })
                .code(),
            absl::StatusCode::kResourceExhausted);
  bounded.ReleaseCompletions();
  EXPECT_TRUE(a.Wait().ok());
  EXPECT_TRUE(b.Wait().ok());
  (*ep)->Close();
}

TEST_F(FakeFabricTest, FailNextRegistrationsAndConnects) {
  std::vector<char> mem(64);
  target_.FailNextRegistrations(1, absl::ResourceExhaustedError("no MTT entries"));
  EXPECT_EQ(target_.Register(mem.data(), 64, kRemoteWrite).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(target_.Register(mem.data(), 64, kRemoteWrite).ok());
  initiator_.FailNextConnects(1, absl::UnavailableError("no route"));
  EXPECT_EQ(ConnectDirect(initiator_, target_).status().code(), absl::StatusCode::kUnavailable);
  auto again = ConnectDirect(initiator_, target_);
  ASSERT_TRUE(again.ok());
  (*again)->Close();
}

TEST_F(FakeFabricTest, BrokenEndpointFailsItsOpsAndAFreshOneWorks) {
  std::vector<char> src(64, 'b'), dst(64, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  initiator_.HoldCompletions();
  Waiter held;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), held.Callback()).ok());
  auto fake = std::dynamic_pointer_cast<FakeEndpoint>(endpoint_);
  ASSERT_NE(fake, nullptr);
  EXPECT_EQ(fake->peer_address(), target_.address());
  fake->Break();
  EXPECT_EQ(held.Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(endpoint_->broken());
  EXPECT_EQ(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), [](absl::Status) {}).code(),
            absl::StatusCode::kUnavailable);
  initiator_.ReleaseCompletions();
  endpoint_->Close();
  Connect();
  Waiter w;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), w.Callback()).ok());
  EXPECT_TRUE(w.Wait().ok());
  // And the fabric-wide knob breaks every endpoint we initiated.
  initiator_.BreakEndpoints();
  EXPECT_TRUE(endpoint_->broken());
}

TEST_F(FakeFabricTest, RefusalBreaksTheEndpointWhenVerbsLike) {
  FakeFabric verbs_like({.refusal_breaks_endpoint = true});
  auto ep = ConnectDirect(verbs_like, target_);
  ASSERT_TRUE(ep.ok());
  std::vector<char> src(64), dst(64);
  auto src_mr = Register(verbs_like, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteRead);
  verbs_like.HoldCompletions();
  Waiter refused, behind;
  ASSERT_TRUE((*ep)->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), refused.Callback()).ok());
  ASSERT_TRUE((*ep)->PostRead({src_mr.get(), 0, 64}, At(*dst_mr), behind.Callback()).ok());
  verbs_like.ReleaseCompletions();
  EXPECT_EQ(refused.Wait().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(behind.Wait().code(), absl::StatusCode::kUnavailable) << "flushed";
  EXPECT_TRUE((*ep)->broken());
  (*ep)->Close();
}

TEST_F(FakeFabricTest, ImmediateIsSeenOnceOnTheTargetThreadAfterItsData) {
  std::vector<char> src(1 << 20, 'i'), dst(1 << 20, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  absl::Mutex mu;
  std::vector<uint32_t> seen;
  bool landed = true;
  std::thread::id handler_thread;
  target_.SetImmediateHandler([&](uint32_t imm) {
    absl::MutexLock lock(&mu);
    seen.push_back(imm);
    landed &= std::count(dst.begin(), dst.end(), 'i') == static_cast<long>(dst.size());
    handler_thread = std::this_thread::get_id();
  });
  Waiter w;
  ASSERT_TRUE(
      endpoint_
          ->PostWriteWithImmediate({src_mr.get(), 0, src.size()}, At(*dst_mr), 42, w.Callback())
          .ok());
  EXPECT_TRUE(w.Wait().ok());
  ASSERT_TRUE(target_.AwaitIdle(kWait));
  // A refused WRITE-with-immediate delivers no immediate.
  Waiter bad;
  ASSERT_TRUE(
      endpoint_->PostWriteWithImmediate({src_mr.get(), 0, 8}, {0, 1}, 43, bad.Callback()).ok());
  EXPECT_FALSE(bad.Wait().ok());
  ASSERT_TRUE(target_.AwaitIdle(kWait));
  target_.SetImmediateHandler(nullptr);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen, std::vector<uint32_t>{42});
  EXPECT_TRUE(landed);
  EXPECT_NE(handler_thread, std::this_thread::get_id());
  EXPECT_EQ(target_.stats().immediates, 1u);
}

TEST_F(FakeFabricTest, RestrictToLocalRefusesPeersAndKeepsLocalUse) {
  std::vector<char> src(64, 'z'), dst(64, 0), peer(64, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite | kRemoteRead);
  ASSERT_TRUE(dst_mr->RestrictToLocal().ok());
  Waiter w, r;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), w.Callback()).ok());
  EXPECT_EQ(w.Wait().code(), absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(endpoint_->PostRead({src_mr.get(), 0, 64}, At(*dst_mr), r.Callback()).ok());
  EXPECT_EQ(r.Wait().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 64);
  // The target still writes from it to others.
  auto back = ConnectDirect(target_, initiator_);
  ASSERT_TRUE(back.ok());
  auto peer_mr = Register(initiator_, peer, kRemoteWrite);
  Waiter local;
  ASSERT_TRUE((*back)->PostWrite({dst_mr.get(), 0, 64}, At(*peer_mr), local.Callback()).ok());
  EXPECT_TRUE(local.Wait().ok()) << local.Wait();
  (*back)->Close();

  FakeFabric fixed({.restrict_to_local = false});
  auto fixed_mr = Register(fixed, dst, kRemoteWrite);
  EXPECT_EQ(fixed_mr->RestrictToLocal().code(), absl::StatusCode::kUnimplemented);
}

TEST_F(FakeFabricTest, DmabufOnlyWhenEnabledAndWithAnOpenFd) {
  std::vector<char> mem(4096);
  EXPECT_EQ(initiator_.RegisterDmabuf(mem.data(), mem.size(), {3, 0}, kLocal).status().code(),
            absl::StatusCode::kUnimplemented);
  FakeFabric gdr({.dmabuf = true});
  EXPECT_EQ(gdr.RegisterDmabuf(mem.data(), mem.size(), {-1, 0}, kLocal).status().code(),
            absl::StatusCode::kInvalidArgument);
  int fd = memfd_create("fake_dmabuf", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto r = gdr.RegisterDmabuf(mem.data(), mem.size(), {fd, 0}, kRemoteWrite);
  ::close(fd);  // transport/fabric.h: the fd may be closed after the call
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(gdr.stats().live_regions, 1u);
}

TEST_F(FakeFabricTest, HandshakeRefusesWhatItDidNotMake) {
  EXPECT_EQ(initiator_.BeginConnect("fake-nobody-0").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(target_.AcceptConnect("hello", {}).status().code(), absl::StatusCode::kInvalidArgument);
  auto third = std::make_unique<FakeFabric>();
  auto pending = initiator_.BeginConnect(target_.address());
  ASSERT_TRUE(pending.ok());
  // A request meant for another fabric.
  EXPECT_EQ(third->AcceptConnect((*pending)->request(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto reply = target_.AcceptConnect((*pending)->request(), {});
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ((*pending)->Finish(*reply + "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pending)->Finish(*reply).status().code(), absl::StatusCode::kFailedPrecondition)
      << "a pending connection finishes once";

  // The peer dies between its answer and our Finish.
  auto late = initiator_.BeginConnect(third->address());
  ASSERT_TRUE(late.ok());
  auto late_reply = third->AcceptConnect((*late)->request(), {});
  ASSERT_TRUE(late_reply.ok());
  third.reset();
  EXPECT_EQ((*late)->Finish(*late_reply).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(FakeFabricTest, StopServingBreaksIncomingEndpointsAndRefusesNewOnes) {
  std::vector<char> src(64), dst(64, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  initiator_.HoldCompletions();
  Waiter held;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), held.Callback()).ok());
  auto pending = initiator_.BeginConnect(target_.address());
  ASSERT_TRUE(pending.ok());
  auto reply = target_.AcceptConnect((*pending)->request(), {});
  ASSERT_TRUE(reply.ok());
  target_.StopServing();
  target_.StopServing();  // idempotent
  EXPECT_EQ(held.Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(endpoint_->broken());
  EXPECT_EQ((*pending)->Finish(*reply).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ConnectDirect(initiator_, target_).status().code(), absl::StatusCode::kUnavailable);
  // Our own endpoints stay usable (transport/fabric.h StopServing).
  std::vector<char> theirs(64, 0);
  auto theirs_mr = Register(initiator_, theirs, kRemoteWrite);
  auto out = ConnectDirect(target_, initiator_);
  ASSERT_TRUE(out.ok()) << out.status();
  Waiter w;
  ASSERT_TRUE((*out)->PostWrite({dst_mr.get(), 0, 64}, At(*theirs_mr), w.Callback()).ok());
  EXPECT_TRUE(w.Wait().ok());
  (*out)->Close();
  initiator_.ReleaseCompletions();
}

TEST_F(FakeFabricTest, DestroyedFabricsFailTheirOpsUnavailable) {
  std::vector<char> src(64), dst(64, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  // The peer goes away with our op waiting.
  {
    auto peer = std::make_unique<FakeFabric>();
    auto dst_mr = Register(*peer, dst, kRemoteWrite);
    auto ep = ConnectDirect(initiator_, *peer);
    ASSERT_TRUE(ep.ok());
    initiator_.HoldCompletions();
    Waiter w;
    ASSERT_TRUE((*ep)->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), w.Callback()).ok());
    dst_mr.reset();
    peer.reset();
    EXPECT_EQ(w.Wait().code(), absl::StatusCode::kUnavailable) << w.Wait();
    EXPECT_TRUE((*ep)->broken());
    initiator_.ReleaseCompletions();
  }
  // Our own fabric goes away with ops waiting: they fail before the destructor returns.
  std::shared_ptr<Endpoint> ep;
  std::atomic<int> unavailable{0};
  {
    FakeFabric doomed;
    std::vector<char> mine(64);
    auto mine_mr = Register(doomed, mine, kLocal);
    auto dst_mr = Register(target_, dst, kRemoteWrite);
    auto connected = ConnectDirect(doomed, target_);
    ASSERT_TRUE(connected.ok());
    ep = *connected;
    doomed.HoldCompletions();
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(ep->PostWrite({mine_mr.get(), 0, 64}, At(*dst_mr), [&](absl::Status s) {
                      if (absl::IsUnavailable(s)) unavailable.fetch_add(1);
                    }).ok());
    }
    ASSERT_TRUE(doomed.AwaitHeld(10, kWait));
    // Regions must not outlive their fabric, nor go while ops use them: a fabric destroyed
    // with ops waiting breaks one rule or the other. This test is about the ops.
    mine_mr.reset();
    FakeFabric::ClearContractViolations();
  }
  EXPECT_EQ(unavailable.load(), 10);
  EXPECT_TRUE(ep->broken());
  ep->Close();
}

TEST_F(FakeFabricTest, ContractViolationsAreRecorded) {
  std::vector<char> src(64), dst(64, 0);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  auto src_mr = Register(initiator_, src, kLocal);
  initiator_.HoldCompletions();
  Waiter w;
  ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, 64}, At(*dst_mr), w.Callback()).ok());
  src_mr.reset();  // must stay registered until `done` runs
  initiator_.ReleaseCompletions();
  EXPECT_EQ(w.Wait().code(), absl::StatusCode::kFailedPrecondition) << w.Wait();
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 64);
  EXPECT_EQ(FakeFabric::ContractViolations().size(), 2u) << "at deregistration and at execution";
  FakeFabric::ClearContractViolations();
  // A region that outlives its fabric.
  auto short_lived = std::make_unique<FakeFabric>();
  auto outlives = Register(*short_lived, src, kLocal);
  short_lived.reset();
  ASSERT_EQ(FakeFabric::ContractViolations().size(), 1u);
  EXPECT_NE(FakeFabric::ContractViolations()[0].find("still registered"), std::string::npos);
  outlives.reset();  // harmless, if late
  FakeFabric::ClearContractViolations();
}

TEST_F(FakeFabricTest, DestroyingARegionWaitsForAccessesInProgress) {
  // Many large WRITEs race the region's destruction: once the destructor returned no byte may
  // land, so the sentinel written right after it must survive every op still to run.
  constexpr int kOps = 64;
  constexpr uint64_t kBlock = 4 << 20;
  std::vector<char> src(kBlock, 'w'), dst(kBlock, 0);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  Recorder done;
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(endpoint_->PostWrite({src_mr.get(), 0, kBlock}, At(*dst_mr), done.Callback()).ok());
  }
  absl::SleepFor(absl::Milliseconds(2));
  dst_mr.reset();
  std::memset(dst.data(), 's', dst.size());
  ASSERT_TRUE(done.AwaitCount(kOps));
  int ok = 0, denied = 0;
  for (const auto& s : done.statuses()) {
    ok += s.ok();
    denied += absl::IsPermissionDenied(s);
  }
  EXPECT_EQ(ok + denied, kOps);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 's'), static_cast<long>(kBlock))
      << "a WRITE landed after the region was destroyed (" << ok << " ran, " << denied
      << " refused)";
}

TEST_F(FakeFabricTest, ConcurrentPostersEachCompleteOnce) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 500;
  std::vector<char> src(kThreads * kPerThread * 8), dst(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i);
  auto src_mr = Register(initiator_, src, kLocal);
  auto dst_mr = Register(target_, dst, kRemoteWrite);
  initiator_.FailNextOps(10, absl::AbortedError("injected"));
  std::vector<std::atomic<int>> calls(kThreads * kPerThread);
  std::atomic<int> aborted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int op = t * kPerThread + i;
        ASSERT_TRUE(endpoint_
                        ->PostWrite({src_mr.get(), op * 8ull, 8}, At(*dst_mr, op * 8ull),
                                    [&, op](absl::Status s) {
                                      calls[op].fetch_add(1);
                                      if (absl::IsAborted(s)) aborted.fetch_add(1);
                                    })
                        .ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(initiator_.AwaitIdle(kWait));
  for (size_t i = 0; i < calls.size(); ++i) ASSERT_EQ(calls[i].load(), 1) << i;
  EXPECT_EQ(aborted.load(), 10);
  FakeFabricStats s = initiator_.stats();
  EXPECT_EQ(s.posts, calls.size());
  EXPECT_EQ(s.completions, calls.size());
  EXPECT_EQ(s.bytes_written, (calls.size() - 10) * 8);
}

TEST_F(FakeFabricTest, ProviderNameAndAddressesAreConfigurableAndUnique) {
  FakeFabric a({.provider = "rail0"}), b({.provider = "rail0"});
  EXPECT_EQ(a.provider(), "rail0");
  EXPECT_EQ(initiator_.provider(), "fake");
  EXPECT_NE(a.address(), b.address());
  std::vector<char> mem(64);
  auto r = Register(a, mem, kLocal);
  EXPECT_EQ(r->registration(), "rail0");
}

}  // namespace
}  // namespace ferry::fake
