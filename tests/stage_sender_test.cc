// StageSender through its public interface: a transfer's staged ops over a fake fabric
// between two in-process "agents", our side staged through real bounce pools and a simulated
// GPU, the peer's side staged through a fake Stage call (tests/fakes/fake_stage_call.h) that
// grants chunks of the peer's own bounce pool. Every test ends with everything given back:
// bounce chunks on both sides, the peer's grants, the fabric's outstanding ops.

#include "server/engine/stage_sender.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/buffers/buffer_registry.h"
#include "tests/fakes/fake_fabric.h"
#include "tests/fakes/sim_gpus.h"
#include "tests/fakes/fake_stage_call.h"
#include "transport/memory/gpu_device.h"
#include "transport/memory/host_pool.h"

namespace ferry::server {
namespace {

using fake::FakeFabric;
using fake::FakeStageCall;

constexpr uint64_t kChunk = 4096;  // the smallest chunk the policy allows
constexpr uint32_t kDepth = 2;
constexpr uint64_t kPeerBytes = 64 * kChunk;
// Long enough for a loaded machine, short enough that a hang fails the test, not ctest.
constexpr absl::Duration kPatience = absl::Seconds(10);

// Byte `i` of the pattern `seed` (so a chunk landing at the wrong offset shows).
char PatternByte(uint64_t i, int seed) { return static_cast<char>((i * 131 + seed * 17) % 251); }

void Fill(char* p, uint64_t n, int seed) {
  for (uint64_t i = 0; i < n; ++i) p[i] = PatternByte(i, seed);
}

// The first differing byte of [p, p+n) from pattern `seed`, or -1.
int64_t Mismatch(const char* p, uint64_t n, int seed) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != PatternByte(i, seed)) return static_cast<int64_t>(i);
  }
  return -1;
}

// How each op of a run ended (what the engine's settle would have recorded).
struct Settled {
  absl::Status status;
  int calls = 0;
};

class StageSenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeFabric::ClearContractViolations();
    auto pool = memory::HostPool::Create(16 * memory::HostPool::kAlignment, "stage_sender_test");
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    auto gpus = fake::SimGpuPools();
    ASSERT_TRUE(gpus.ok()) << gpus.status();
    gpus_ = std::move(*gpus);
    registry_ = std::make_unique<BufferRegistry>(pool_.get(), gpus_.get(),
                                                 std::vector<fabric::Fabric*>{&local_});
    bounce_ = std::make_unique<BouncePools>(std::vector<fabric::Fabric*>{&local_}, gpus_.get());
    peer_bounce_ = std::make_unique<BouncePools>(std::vector<fabric::Fabric*>{&peer_}, nullptr);
    snapshot_ = std::make_shared<PolicySnapshot>();
    snapshot_->generation = 1;
    snapshot_->policy.staging_chunk_bytes = kChunk;
    snapshot_->policy.staging_depth = kDepth;
    auto peer_pool = peer_bounce_->Get(-1, *snapshot_);
    ASSERT_TRUE(peer_pool.ok()) << peer_pool.status();
    peer_pool_ = *peer_pool;
    peer_memory_.assign(kPeerBytes, 0);
    auto region = peer_.Register(peer_memory_.data(), peer_memory_.size(),
                                 fabric::kRemoteWrite | fabric::kRemoteRead);
    ASSERT_TRUE(region.ok()) << region.status();
    peer_region_ = std::move(*region);
    auto ep = fabric::ConnectDirect(local_, peer_);
    ASSERT_TRUE(ep.ok()) << ep.status();
    endpoint_ = std::move(*ep);
  }

  void TearDown() override {
    // Everything a run took is back, on both sides.
    EXPECT_TRUE(local_.AwaitIdle(kPatience));
    EXPECT_EQ(local_.stats().outstanding, 0u);
    EXPECT_EQ(LocalChunksInUse(), 0u);
    EXPECT_EQ(peer_pool_->pool().in_use(), 0u) << "a peer chunk is still granted";
    for (const auto& call : calls_) {
      EXPECT_EQ(call->outstanding_grants(), 0u) << call->spec().buffer;
      EXPECT_TRUE(call->ended()) << call->spec().buffer << ": the sender left its call open";
      for (const auto& v : call->violations()) ADD_FAILURE() << v;
    }
    calls_.clear();
    endpoint_->Close();
    endpoint_.reset();
    peer_pool_.reset();
    peer_bounce_.reset();
    bounce_.reset();
    buffers_.clear();
    registry_.reset();
    peer_region_.reset();
    EXPECT_EQ(pool_->used(), 0u);
    EXPECT_EQ(local_.stats().live_regions, 0u);
    EXPECT_EQ(peer_.stats().live_regions, 0u);
    for (const auto& v : FakeFabric::ContractViolations()) ADD_FAILURE() << v;
  }

  uint32_t LocalChunksInUse() const {
    uint32_t n = 0;
    for (const auto& s : bounce_->Stats()) n += s.chunks_in_use;
    return n;
  }
  uint32_t LocalPeakInUse() const {
    uint32_t n = 0;
    for (const auto& s : bounce_->Stats()) n = std::max(n, s.peak_chunks_in_use);
    return n;
  }

  // A buffer of ours: on the simulated GPU (to be staged) or in the host pool (direct),
  // filled with pattern `seed`.
  std::shared_ptr<Buffer> Local(uint64_t size, bool gpu, int seed) {
    auto b = registry_->Allocate(size, "", gpu ? "cuda:0" : "host");
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return nullptr;
    std::vector<char> bytes(size);
    Fill(bytes.data(), size, seed);
    EXPECT_TRUE(Write(**b, bytes).ok());
    buffers_.push_back(*b);
    return *b;
  }

  // A buffer's bytes go in and come out through the GPU's copy engine when it is a GPU's:
  // the CPU cannot touch device memory.
  absl::Status Write(const Buffer& b, const std::vector<char>& bytes) {
    if (b.gpu() < 0) {
      std::memcpy(b.data(), bytes.data(), bytes.size());
      return absl::OkStatus();
    }
    return fake::WriteGpu(gpus_->device(b.gpu()), b.data(), bytes.data(), bytes.size());
  }
  std::vector<char> Read(const Buffer& b) {
    std::vector<char> bytes(b.size());
    if (b.gpu() < 0) {
      std::memcpy(bytes.data(), b.data(), bytes.size());
    } else {
      EXPECT_TRUE(fake::ReadGpu(gpus_->device(b.gpu()), bytes.data(), b.data(), b.size()).ok());
    }
    return bytes;
  }

  // The peer's buffer `name`: all of peer_memory_, staged (through a Stage call) or direct
  // (its key on our provider).
  std::shared_ptr<const RemoteBuffer> Remote(const std::string& name, bool staged) {
    auto r = std::make_shared<RemoteBuffer>();
    r->node = "peer";
    r->name = name;
    r->size = kPeerBytes;
    r->device = staged ? "cuda:0" : "host";
    r->mode = staged ? LegMode::kStaged : LegMode::kHost;
    if (!staged) {
      r->keys.push_back({peer_.rail(), {peer_region_->remote_address(), peer_region_->key()}});
    }
    return r;
  }

  // An op of the batch Prepare makes, with the buffers it will keep for it.
  struct TestOp {
    PlannedOp op;
    std::shared_ptr<Buffer> local;
    std::shared_ptr<const RemoteBuffer> remote;
  };
  static TestOp Op(ferry::v1::OpType type, std::shared_ptr<Buffer> local, uint64_t local_offset,
                   uint64_t length, std::shared_ptr<const RemoteBuffer> remote,
                   uint64_t remote_offset) {
    return {{type, nullptr, local_offset, length, nullptr, remote_offset},
            std::move(local),
            std::move(remote)};
  }

  // Makes the transfer and its sender; every op is staged on our side iff its buffer is on
  // the GPU. The peer's calls are FakeStageCalls (held: copies wait for ReleaseCopies).
  void Prepare(std::vector<TestOp> test_ops, bool hold_copies = false,
               absl::Duration timeout = kPatience) {
    PlannedBatch ops;
    for (TestOp& t : test_ops) {
      t.op.local = ops.Keep(std::move(t.local));
      t.op.remote = ops.Keep(std::move(t.remote));
      ops.ops.push_back(t.op);
    }
    const size_t n = ops.size();
    std::vector<StagedOp> staged;
    for (size_t i = 0; i < n; ++i) {
      LegPlan plan;
      plan.mode = ops[i].local->gpu() >= 0 ? LegMode::kStaged : LegMode::kHost;
      staged.push_back({i, plan, {endpoint_, local_.rail(), peer_.rail()}});
    }
    transfer_ = std::make_shared<Transfer>(7, std::move(ops), absl::Now() + timeout, snapshot_);
    settled_ = std::make_shared<std::vector<Settled>>(n);
    for (size_t i = 0; i < n; ++i) {
      ferry::v1::Leg local, remote;
      local.set_side("local");
      remote.set_side("remote");
      transfer_->SetLegs(i, {local, remote});
    }
    StageSender::Deps deps;
    deps.gpus = gpus_.get();
    deps.bounce = bounce_.get();
    deps.stage_calls = [this, hold_copies](const StageCallSpec& spec, StageEvents* events)
        -> absl::StatusOr<std::shared_ptr<StageCall>> {
      auto call = std::make_shared<FakeStageCall>(spec, events, peer_pool_, peer_.rail(),
                                                  peer_memory_.data(), kPeerBytes, hold_copies);
      if (grants_before_failure_ >= 0) {
        call->FailGrantsAfter(grants_before_failure_, absl::ResourceExhaustedError("no credit"));
      }
      absl::MutexLock lock(&calls_mu_);
      calls_.push_back(call);
      return call;
    };
    deps.settle = [this, t = transfer_, s = settled_](size_t index, const absl::Status& status,
                                                      const std::string& provider) {
      {
        // Each op settles once (the sender's promise); the test counts any second time.
        absl::MutexLock lock(&settled_mu_);
        if (++(*s)[index].calls == 1) (*s)[index].status = status;
      }
      t->Settle(index, status, provider);
    };
    sender_ = std::make_shared<StageSender>(transfer_, transfer_->ops(), std::move(staged),
                                            std::move(deps));
  }

  // Runs the sender on this thread; it must return with every op settled.
  void RunToEnd() {
    sender_->Run();
    EXPECT_TRUE(transfer_->finished());
    for (size_t i = 0; i < settled_->size(); ++i) {
      EXPECT_EQ((*settled_)[i].calls, 1) << "op " << i << " settled more than once, or never";
    }
    sender_.reset();
  }

  // Runs the sender on a thread of its own (for tests that act while it runs).
  void RunInBackground() {
    run_done_ = std::make_shared<absl::Notification>();
    runner_ = std::thread([sender = sender_, done = run_done_] {
      sender->Run();
      done->Notify();
    });
  }
  // True when Run returned within `timeout`; joins the thread then.
  bool JoinRun(absl::Duration timeout) {
    if (!run_done_->WaitForNotificationWithTimeout(timeout)) return false;
    runner_.join();
    sender_.reset();
    return true;
  }

  ferry::v1::OpResult ResultOf(size_t i) const {
    ResultPage page;
    page.include_ops = true;
    return transfer_->Result(page).ops(static_cast<int>(i));
  }

  std::shared_ptr<FakeStageCall> CallFor(const std::string& buffer, bool read) {
    absl::MutexLock lock(&calls_mu_);
    for (auto& c : calls_) {
      if (c->spec().buffer == buffer && c->spec().read == read) return c;
    }
    return nullptr;
  }

  // Declared so that they go in this order: the calls and the sender, the endpoint, the
  // peer's pool, our pools and buffers, the regions, the fabrics, the GPUs, the host pool.
  std::unique_ptr<memory::HostPool> pool_;
  std::unique_ptr<GpuPools> gpus_;
  FakeFabric peer_{{.provider = "fake"}};
  FakeFabric local_{{.provider = "fake"}};
  std::vector<char> peer_memory_;
  std::unique_ptr<fabric::MemoryRegion> peer_region_;
  std::unique_ptr<BufferRegistry> registry_;
  std::vector<std::shared_ptr<Buffer>> buffers_;
  std::unique_ptr<BouncePools> bounce_;
  std::unique_ptr<BouncePools> peer_bounce_;
  std::shared_ptr<StagingPool> peer_pool_;
  std::shared_ptr<PolicySnapshot> snapshot_;
  std::shared_ptr<fabric::Endpoint> endpoint_;
  std::shared_ptr<Transfer> transfer_;
  // Read by the test once the transfer finished (Transfer's lock orders the writes before).
  absl::Mutex settled_mu_;
  std::shared_ptr<std::vector<Settled>> settled_;
  absl::Mutex calls_mu_;
  std::vector<std::shared_ptr<FakeStageCall>> calls_;
  int grants_before_failure_ = -1;  // for the calls made next: FailGrantsAfter
  std::shared_ptr<StageSender> sender_;
  std::shared_ptr<absl::Notification> run_done_;
  std::thread runner_;
};

// The shapes: which side is staged, for WRITE and READ.
struct Shape {
  const char* name;
  bool local_staged;
  bool remote_staged;
};
constexpr Shape kShapes[] = {{"staged local, direct peer", true, false},
                             {"direct local, staged peer", false, true},
                             {"both staged", true, true}};

// Not a multiple of the chunk: the last chunk is short. Offsets on both sides are odd, so a
// chunk placed by the wrong base shows in the bytes.
constexpr uint64_t kLength = 5 * kChunk + 100;
constexpr uint64_t kChunks = 6;
constexpr uint64_t kLocalOffset = 300;
constexpr uint64_t kRemoteOffset = 2 * kChunk + 7;

TEST_F(StageSenderTest, WriteMovesVerifiedBytesInEveryShape) {
  int seed = 1;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE(shape.name);
    std::fill(peer_memory_.begin(), peer_memory_.end(), 0);
    auto local = Local(kLocalOffset + kLength, shape.local_staged, ++seed);
    Prepare({Op(ferry::v1::WRITE, local, kLocalOffset, kLength,
                Remote(absl::StrCat("w", seed), shape.remote_staged), kRemoteOffset)});
    RunToEnd();
    ASSERT_TRUE((*settled_)[0].status.ok()) << (*settled_)[0].status;
    // Exactly the op's range of the peer's buffer changed, to our bytes from the op's offset.
    for (uint64_t i = 0; i < kLength; ++i) {
      ASSERT_EQ(peer_memory_[kRemoteOffset + i], PatternByte(kLocalOffset + i, seed)) << i;
    }
    EXPECT_EQ(std::count(peer_memory_.begin(), peer_memory_.begin() + kRemoteOffset, 0),
              static_cast<long>(kRemoteOffset));
    EXPECT_EQ(std::count(peer_memory_.begin() + kRemoteOffset + kLength, peer_memory_.end(), 0),
              static_cast<long>(kPeerBytes - kRemoteOffset - kLength));
    ferry::v1::OpResult r = ResultOf(0);
    EXPECT_EQ(r.bytes(), kLength);
    ASSERT_EQ(r.legs_size(), 2);
    EXPECT_EQ(r.legs(kLocalLeg).chunks(), shape.local_staged ? kChunks : 0u);
    EXPECT_EQ(r.legs(kRemoteLeg).chunks(), shape.remote_staged ? kChunks : 0u);
    EXPECT_EQ(r.provider(), "fake");
    if (shape.remote_staged) {
      auto call = CallFor(absl::StrCat("w", seed), false);
      ASSERT_NE(call, nullptr);
      EXPECT_EQ(call->copies(), kChunks);
      EXPECT_LE(call->peak_grants(), kDepth);
    }
    EXPECT_EQ(LocalChunksInUse(), 0u);
  }
}

TEST_F(StageSenderTest, ReadMovesVerifiedBytesInEveryShape) {
  int seed = 10;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE(shape.name);
    Fill(peer_memory_.data(), kPeerBytes, ++seed);
    auto local = Local(kLocalOffset + kLength + 64, shape.local_staged, 99);
    Prepare({Op(ferry::v1::READ, local, kLocalOffset, kLength,
                Remote(absl::StrCat("r", seed), shape.remote_staged), kRemoteOffset)});
    RunToEnd();
    ASSERT_TRUE((*settled_)[0].status.ok()) << (*settled_)[0].status;
    const std::vector<char> bytes = Read(*local);
    const char* got = bytes.data();
    for (uint64_t i = 0; i < kLength; ++i) {
      ASSERT_EQ(got[kLocalOffset + i], PatternByte(kRemoteOffset + i, seed)) << i;
    }
    // Around the op's range, our buffer is as it was.
    EXPECT_EQ(Mismatch(got, kLocalOffset, 99), -1);
    for (uint64_t i = kLocalOffset + kLength; i < local->size(); ++i) {
      ASSERT_EQ(got[i], PatternByte(i, 99)) << i;
    }
    ferry::v1::OpResult r = ResultOf(0);
    EXPECT_EQ(r.bytes(), kLength);
    EXPECT_EQ(r.legs(kLocalLeg).chunks(), shape.local_staged ? kChunks : 0u);
    EXPECT_EQ(r.legs(kRemoteLeg).chunks(), shape.remote_staged ? kChunks : 0u);
    if (shape.remote_staged) {
      auto call = CallFor(absl::StrCat("r", seed), true);
      ASSERT_NE(call, nullptr);
      EXPECT_EQ(call->copies(), kChunks);
    }
  }
}

// The window: with one side staged, at most `depth` chunks are in flight, our bounce chunks
// or the peer's grants; and the pipeline does use them (more than one at once).
TEST_F(StageSenderTest, NoMoreThanDepthChunksInFlightPerStagedSide) {
  constexpr uint64_t kLong = 24 * kChunk;
  for (auto type : {ferry::v1::WRITE, ferry::v1::READ}) {
    SCOPED_TRACE(ferry::v1::OpType_Name(type));
    // Ours staged: the bounce pool's peak.
    bounce_ = std::make_unique<BouncePools>(std::vector<fabric::Fabric*>{&local_}, gpus_.get());
    Prepare({Op(type, Local(kLong, true, 3), 0, kLong, Remote("direct", false), 0)});
    RunToEnd();
    ASSERT_TRUE((*settled_)[0].status.ok()) << (*settled_)[0].status;
    EXPECT_LE(LocalPeakInUse(), kDepth);
    EXPECT_GE(LocalPeakInUse(), 1u);
    // The peer's staged: its grants at once.
    const std::string name = absl::StrCat("window-", ferry::v1::OpType_Name(type));
    Prepare({Op(type, Local(kLong, false, 4), 0, kLong, Remote(name, true), 0)});
    RunToEnd();
    ASSERT_TRUE((*settled_)[0].status.ok()) << (*settled_)[0].status;
    auto call = CallFor(name, type == ferry::v1::READ);
    ASSERT_NE(call, nullptr);
    EXPECT_LE(call->peak_grants(), kDepth);
    EXPECT_LE(peer_pool_->pool().peak_in_use(), kDepth);
  }
}

// A WRITE chunk that fails on the wire fails its op with the fabric's status; every bounce
// chunk of ours and every grant of the peer's comes back.
TEST_F(StageSenderTest, AFabricFailureFailsTheOpAndGivesEverythingBack) {
  for (const Shape& shape : kShapes) {
    for (auto type : {ferry::v1::WRITE, ferry::v1::READ}) {
      SCOPED_TRACE(absl::StrCat(shape.name, ", ", ferry::v1::OpType_Name(type)));
      const absl::Status injected = absl::DataLossError("injected: link CRC error");
      const std::string name = absl::StrCat("fail-", shape.name, ferry::v1::OpType_Name(type));
      Prepare({Op(type, Local(kLength, shape.local_staged, 5), 0, kLength,
                  Remote(name, shape.remote_staged), 0)});
      const uint64_t failed_before = local_.stats().failed_completions;
      local_.FailNextOps(1, injected);
      RunToEnd();
      EXPECT_EQ((*settled_)[0].status, injected);
      ferry::v1::OpResult r = ResultOf(0);
      EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kDataLoss));
      EXPECT_EQ(r.bytes(), 0u);
      EXPECT_EQ(local_.stats().failed_completions, failed_before + 1);
      EXPECT_TRUE(local_.AwaitIdle(kPatience));
      EXPECT_EQ(LocalChunksInUse(), 0u);
      if (shape.remote_staged) {
        auto call = CallFor(name, type == ferry::v1::READ);
        ASSERT_NE(call, nullptr);
        EXPECT_EQ(call->outstanding_grants(), 0u);
      }
      EXPECT_EQ(peer_pool_->pool().in_use(), 0u);
    }
  }
}

// Cancel while the fabric holds the chunks on the wire: no new chunk starts, the op settles
// at once, and what the held chunks hold (our bounce chunks) stays held until the fabric
// completes them; then Run returns and everything is back.
TEST_F(StageSenderTest, CancelWhileCompletionsAreHeld) {
  constexpr uint64_t kLong = 16 * kChunk;
  Prepare({Op(ferry::v1::WRITE, Local(kLong, true, 6), 0, kLong, Remote("direct", false), 0)});
  local_.HoldCompletions();
  RunInBackground();
  ASSERT_TRUE(local_.AwaitHeld(kDepth, kPatience));
  sender_->Cancel();
  ASSERT_TRUE(transfer_->AwaitFinished(absl::Now() + kPatience))
      << "Cancel did not settle the op while its chunks were on the wire";
  EXPECT_FALSE((*settled_)[0].status.ok());
  EXPECT_EQ(local_.stats().posts, kDepth) << "a chunk started after Cancel";
  EXPECT_EQ(LocalChunksInUse(), kDepth) << "a bounce chunk went back while the fabric had it";
  local_.ReleaseCompletions();
  ASSERT_TRUE(JoinRun(kPatience)) << "Run did not return once the held chunks completed";
  EXPECT_EQ(local_.stats().posts, kDepth);
  EXPECT_EQ(LocalChunksInUse(), 0u);
  EXPECT_EQ((*settled_)[0].calls, 1);
}

// Cancel also ends the peer's Stage calls: a sender waiting for credits (the peer is slow to
// copy) stops, and Run returns.
TEST_F(StageSenderTest, CancelEndsTheStageCalls) {
  constexpr uint64_t kLong = 16 * kChunk;
  Prepare({Op(ferry::v1::WRITE, Local(kLong, false, 7), 0, kLong, Remote("slow", true), 0)},
          /*hold_copies=*/true);
  RunInBackground();
  std::shared_ptr<FakeStageCall> call;
  for (absl::Time give_up = absl::Now() + kPatience; !call && absl::Now() < give_up;) {
    call = CallFor("slow", false);
    if (!call) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->AwaitHeld(kDepth, kPatience));
  sender_->Cancel();
  ASSERT_TRUE(JoinRun(kPatience)) << "Run kept waiting for credits after Cancel";
  EXPECT_TRUE(call->ended());
  EXPECT_TRUE(transfer_->finished());
  EXPECT_FALSE((*settled_)[0].status.ok());
  EXPECT_EQ(call->copies(), 0u);
}

// A Stage call that fails fails the ops that use it, and only those: another op of the same
// transfer, to another buffer of the peer, still moves.
TEST_F(StageSenderTest, AFailedCallFailsOnlyItsOps) {
  const absl::Status gone = absl::UnavailableError("Stage: the peer agent went away");
  auto a = Local(2 * kChunk, false, 8);
  auto b = Local(3 * kChunk, false, 9);
  // Op 0's two chunks fill the window, so op 1 waits for them; their copies are held.
  Prepare({Op(ferry::v1::WRITE, a, 0, 2 * kChunk, Remote("a", true), 0),
           Op(ferry::v1::WRITE, b, 0, 3 * kChunk, Remote("b", true), 8 * kChunk)},
          /*hold_copies=*/true);
  RunInBackground();
  std::shared_ptr<FakeStageCall> call_a;
  for (absl::Time give_up = absl::Now() + kPatience; !call_a && absl::Now() < give_up;) {
    call_a = CallFor("a", false);
    if (!call_a) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_NE(call_a, nullptr);
  ASSERT_TRUE(call_a->AwaitHeld(2, kPatience));
  call_a->Fail(gone);
  // Op 1's call opens now; its copies are held too: let them go.
  std::shared_ptr<FakeStageCall> call_b;
  for (absl::Time give_up = absl::Now() + kPatience; !call_b && absl::Now() < give_up;) {
    call_b = CallFor("b", false);
    if (!call_b) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_NE(call_b, nullptr);
  call_b->ReleaseCopies();
  ASSERT_TRUE(JoinRun(kPatience));
  EXPECT_EQ((*settled_)[0].status, gone);
  EXPECT_TRUE((*settled_)[1].status.ok()) << (*settled_)[1].status;
  EXPECT_EQ(Mismatch(peer_memory_.data() + 8 * kChunk, 3 * kChunk, 9), -1);
  EXPECT_EQ(ResultOf(1).legs(kRemoteLeg).chunks(), 3u);
  EXPECT_EQ(call_a->copies(), 0u);
  EXPECT_EQ(call_b->copies(), 3u);
}

// An op that already failed (a chunk got no credit) still has a chunk the peer was asked to
// copy; when the call then fails, its window slot comes back too, so Run returns then and not
// at the transfer's deadline. (OnCallFailed once skipped failed ops: Run waited for their
// slots until the deadline, and so did the engine's shutdown, which joins the sender.)
TEST_F(StageSenderTest, ACallFailingAfterItsOpFailedGivesTheWindowBack) {
  constexpr uint64_t kLong = 8 * kChunk;
  grants_before_failure_ = 1;
  Prepare({Op(ferry::v1::WRITE, Local(kLong, false, 11), 0, kLong, Remote("late", true), 0)},
          /*hold_copies=*/true, /*timeout=*/absl::Seconds(4));
  RunInBackground();
  ASSERT_TRUE(transfer_->AwaitFinished(absl::Now() + kPatience));
  EXPECT_EQ((*settled_)[0].status.code(), absl::StatusCode::kResourceExhausted);
  auto call = CallFor("late", false);
  ASSERT_NE(call, nullptr);
  ASSERT_TRUE(call->AwaitHeld(1, kPatience)) << "the first chunk was not reported";
  call->Fail(absl::UnavailableError("Stage: the peer agent went away"));
  // Well before the deadline (4 s), after which Run gives up waiting anyway.
  if (!JoinRun(absl::Seconds(3))) {
    ADD_FAILURE() << "Run waited for window slots of chunks that will never be reported";
    runner_.join();
    sender_.reset();
  }
  EXPECT_EQ(call->copies(), 0u);
}

}  // namespace
}  // namespace ferry::server
