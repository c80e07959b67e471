// Issue 44, rows 1 and 2, between two real agents over tcp: a client registers memory it
// can shrink (a memfd without MFD_ALLOW_SEALING, as a /dev/shm file or torch's
// share_memory_() is) and truncates it. Whatever role that memory has in an op (the source
// or target of a WRITE or READ, on this node or the peer's, or a verified block move), the
// op fails naming what happened, both agents live, and another client moving data over the
// same agents and the same tcp connections meanwhile sees no failure at all.

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/unique_fd.h"
#include "client/block_client.h"
#include "client/ferry_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/text_file.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBytes = 4 << 20;
constexpr uint64_t kOp = 1 << 20;

// A memfd of kBytes that can shrink (no sealing), filled with `fill`; the test never maps
// it, so truncating it faults only the agents.
UniqueFd ShrinkableMemfd(char fill) {
  UniqueFd fd(memfd_create("shrunk_memory_test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(ftruncate(fd.get(), kBytes), 0);
  std::string bytes(kBytes, fill);
  EXPECT_EQ(pwrite(fd.get(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(kBytes));
  return fd;
}

// Another client's 4 KiB WRITEs node-a -> node-b in a loop, each verified by a READ back,
// until stopped: what must not notice anything.
class BystanderLoad {
 public:
  explicit BystanderLoad(const AgentProcess& a) {
    auto c = Client::Connect(a.socket());
    EXPECT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    auto src = client_->Alloc(4096);
    auto back = client_->Alloc(4096);
    EXPECT_TRUE(src.ok() && back.ok());
    src_ = std::move(*src);
    back_ = std::move(*back);
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  ~BystanderLoad() { Stop(); }
  int ok() const { return ok_.load(); }
  int failed() const { return failed_.load(); }
  const std::string& first_error() const { return first_error_; }

 private:
  void Loop() {
    for (int i = 0; !stop_.load(); ++i) {
      std::memset(src_->data(), 'a' + i % 26, 4096);
      absl::Status w = client_->Write(*src_, 0, "node-b", "bystander", 0, 4096);
      absl::Status r = w.ok() ? client_->Read(*back_, 0, "node-b", "bystander", 0, 4096) : w;
      if (r.ok() && std::memcmp(src_->data(), back_->data(), 4096) == 0) {
        ++ok_;
      } else {
        if (failed_++ == 0) first_error_ = r.ok() ? "mismatch" : r.ToString();
      }
    }
  }
  std::unique_ptr<Client> client_;
  std::unique_ptr<Buffer> src_, back_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0}, failed_{0};
  std::string first_error_;
  std::thread thread_;
};

class ShrunkMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(pair_.Start().ok());
    auto landing = pair_.cb->Alloc(kBytes, "landing");
    auto bystander = pair_.cb->Alloc(4096, "bystander");
    auto healthy = pair_.ca->Alloc(kBytes);
    ASSERT_TRUE(landing.ok() && bystander.ok() && healthy.ok());
    landing_ = std::move(*landing);
    bystander_ = std::move(*bystander);
    healthy_ = std::move(*healthy);
    std::memset(healthy_->data(), 'h', kBytes);
  }
  void TearDown() override {
    if (HasFailure()) {
      PrintLogTail("node-a", absl::StrCat(pair_.dir, "/node-a.log"));
      PrintLogTail("node-b", absl::StrCat(pair_.dir, "/node-b.log"));
    }
    landing_.reset();
    bystander_.reset();
    healthy_.reset();
  }

  // One op, run; its status.
  absl::Status RunOne(Client& c, ferry::v1::OpType type, uint64_t local,
                      const std::string& remote) {
    auto r = c.Run({{type, local, 0, "node-b", remote, 0, kOp}}, absl::Seconds(20));
    return r.ok() ? TransferStatus(*r) : r.status();
  }

  Pair pair_;
  std::unique_ptr<Buffer> landing_, bystander_, healthy_;
};

TEST_F(ShrunkMemoryTest, EveryRoleOfShrunkMemoryFailsItsOwnOpOnlyAndTheAgentsLive) {
  BystanderLoad load(*pair_.a);

  // 1. The source of a WRITE, on this node: sendmsg finds it gone (EFAULT).
  UniqueFd src = ShrinkableMemfd('s');
  auto src_reg = pair_.ca->RegisterFd(src.get(), 0, kBytes);
  ASSERT_TRUE(src_reg.ok()) << src_reg.status();
  ASSERT_EQ(ftruncate(src.get(), 0), 0);
  absl::Status write_from = RunOne(*pair_.ca, ferry::v1::WRITE, src_reg->buffer().id(), "landing");
  EXPECT_EQ(write_from.code(), absl::StatusCode::kDataLoss) << write_from;
  EXPECT_THAT(write_from.message(), HasSubstr("local memory could not be read"));

  // 1b. The same memory in a batch between good ops, which may leave in one sendmsg with it:
  // only its own op fails (the kernel's EFAULT names no iovec of several).
  // A large op first keeps the connections busy, so the small ones behind it leave together.
  std::vector<OpSpec> mixed = {{ferry::v1::WRITE, healthy_->id(), 0, "node-b", "landing", 0,
                                2 << 20}};
  for (int i = 1; i <= 60; ++i) {
    const bool bad = i % 2 == 0;
    mixed.push_back({ferry::v1::WRITE, bad ? src_reg->buffer().id() : healthy_->id(),
                     static_cast<uint64_t>(i) << 12, "node-b", "landing",
                     (2 << 20) + (static_cast<uint64_t>(i) << 12), 1024});
  }
  auto batch = pair_.ca->Run(mixed, absl::Seconds(20), /*include_ops=*/true);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->ops_size(), 61);
  int wrong = 0;
  for (const auto& op : batch->ops()) {
    const bool bad = op.index() > 0 && op.index() % 2 == 0;
    if (op.code() != (bad ? static_cast<int>(absl::StatusCode::kDataLoss) : 0)) {
      ADD_FAILURE() << "op " << op.index() << ": " << op.message();
      if (++wrong > 3) break;
    }
  }
  EXPECT_EQ(landing_->data()[0], 'h');

  // 2. The destination of a READ, on this node: recv finds it gone.
  UniqueFd dst = ShrinkableMemfd('d');
  auto dst_reg = pair_.ca->RegisterFd(dst.get(), 0, kBytes);
  ASSERT_TRUE(dst_reg.ok()) << dst_reg.status();
  ASSERT_EQ(ftruncate(dst.get(), 0), 0);
  absl::Status read_into = RunOne(*pair_.ca, ferry::v1::READ, dst_reg->buffer().id(), "landing");
  EXPECT_EQ(read_into.code(), absl::StatusCode::kDataLoss) << read_into;
  EXPECT_THAT(read_into.message(), HasSubstr("local memory could not be written"));

  // 3. The target of a WRITE, on the peer: its recv finds it gone; it drains the payload and
  // answers that op alone.
  UniqueFd theirs = ShrinkableMemfd('t');
  auto theirs_reg = pair_.cb->RegisterFd(theirs.get(), 0, kBytes, "host", "shrunk-target");
  ASSERT_TRUE(theirs_reg.ok()) << theirs_reg.status();
  ASSERT_EQ(ftruncate(theirs.get(), 0), 0);
  absl::Status write_into =
      RunOne(*pair_.ca, ferry::v1::WRITE, healthy_->id(), "shrunk-target");
  EXPECT_EQ(write_into.code(), absl::StatusCode::kDataLoss) << write_into;
  EXPECT_THAT(write_into.message(), HasSubstr("target's memory went away"));

  // 4. The source of a READ, on the peer: read under a FaultGuard, answered without payload.
  UniqueFd source = ShrinkableMemfd('r');
  auto source_reg = pair_.cb->RegisterFd(source.get(), 0, kBytes, "host", "shrunk-source");
  ASSERT_TRUE(source_reg.ok()) << source_reg.status();
  ASSERT_EQ(ftruncate(source.get(), 0), 0);
  absl::Status read_from = RunOne(*pair_.ca, ferry::v1::READ, healthy_->id(), "shrunk-source");
  EXPECT_EQ(read_from.code(), absl::StatusCode::kDataLoss) << read_from;
  // Again: the region is marked, and answered so without touching it.
  absl::Status read_again = RunOne(*pair_.ca, ferry::v1::READ, healthy_->id(), "shrunk-source");
  EXPECT_EQ(read_again.code(), absl::StatusCode::kDataLoss) << read_again;

  // 5. A verified block move whose source shrank after the bytes went: the checksum (the
  // agent's CPU reading the file) faults, and the move fails naming the registration.
  UniqueFd moved = ShrinkableMemfd('m');
  auto moved_reg = pair_.ca->RegisterFd(moved.get(), 0, kBytes);
  ASSERT_TRUE(moved_reg.ok()) << moved_reg.status();
  BlockClient blocks(pair_.ca->shared_session());
  BlockClient their_blocks(pair_.cb->shared_session());
  auto mine = blocks.Prepare({Extent(moved_reg->buffer().id(), 0, 64 << 10, 64)});
  auto target = their_blocks.Prepare({Extent(landing_->id(), 0, 64 << 10, 64)}, "kv");
  ASSERT_TRUE(mine.ok() && target.ok());
  ASSERT_EQ(ftruncate(moved.get(), 0), 0);
  std::vector<uint64_t> all(64);
  for (uint64_t i = 0; i < 64; ++i) all[i] = i;
  auto verified = blocks.Move(ferry::v1::WRITE, mine->list(), all, "node-b", "kv", all, "",
                              20000, /*verify=*/true, /*wait=*/true);
  EXPECT_FALSE(verified.ok() && verified->result().state() == ferry::v1::SUCCEEDED)
      << "a move from vanished memory succeeded";

  // The agents live, and the bystander, on the same agents and connections, saw nothing.
  absl::SleepFor(absl::Milliseconds(300));
  load.Stop();
  EXPECT_TRUE(pair_.a->running());
  EXPECT_TRUE(pair_.b->running());
  EXPECT_GT(load.ok(), 10);
  EXPECT_EQ(load.failed(), 0) << load.first_error();
  auto info_a = pair_.ca->GetInfo();
  auto info_b = pair_.cb->GetInfo();
  EXPECT_TRUE(info_a.ok() && info_b.ok());
  std::printf("bystander: %d verified round trips, %d failed, while 5 ops on shrunk memory "
              "failed\n",
              load.ok(), load.failed());
}

}  // namespace
}  // namespace ferry
