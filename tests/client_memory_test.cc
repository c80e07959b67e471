// Memory the client allocated itself (RegisterMemory), prepared block lists and MoveBlocks
// between two real agents: bytes land in the client's own pages, each failure is a clear
// status naming the field, and registrations, lists and passed descriptors are gone once the
// clients are (the accounting check at teardown includes them).

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "client/block_client.h"
#include "client/ferry_client.h"
#include "client/shared_memory.h"
#include "client/tensor_client.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/peer_channel.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

// A memfd of `bytes` mapped shared here: memory a client allocated itself.
struct SharedRegion {
  explicit SharedRegion(uint64_t n, bool sealable = true) : bytes(n) {
    fd = UniqueFd(memfd_create("client-memory-test", MFD_CLOEXEC |
                                                         (sealable ? MFD_ALLOW_SEALING : 0)));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(n)), 0);
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    EXPECT_NE(p, MAP_FAILED);
    data = static_cast<char*>(p);
  }
  ~SharedRegion() { munmap(data, bytes); }
  void Fill(uint32_t seed) {
    std::mt19937 rng(seed);
    for (uint64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(rng());
  }
  UniqueFd fd;
  char* data = nullptr;
  uint64_t bytes;
};

// One side of a test: its own session's client and block client.
struct Side {
  std::shared_ptr<AgentSession> session;
  std::unique_ptr<Client> client;
  std::unique_ptr<BlockClient> blocks;
  std::unique_ptr<TensorClient> tensors;
};

Side Connect(const AgentProcess& agent) {
  Side s;
  auto session = AgentSession::Open(agent.socket(), absl::Seconds(5), "client memory test");
  EXPECT_TRUE(session.ok()) << session.status();
  s.session = *session;
  s.client = std::make_unique<Client>(s.session);
  s.blocks = std::make_unique<BlockClient>(s.session);
  s.tensors = std::make_unique<TensorClient>(s.session);
  return s;
}

// The transfer's result once it ended, by polling (as a handle does).
ferry::v1::TransferResult AwaitByPoll(Client& c, uint64_t id, bool failed_ops = false) {
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    auto r = c.Poll(id, failed_ops);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->state() != ferry::v1::RUNNING || absl::Now() > deadline) {
      return r.ok() ? *r : ferry::v1::TransferResult();
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

class ClientMemoryTest : public ::testing::Test {
 protected:
  // One simulated GPU per agent whose copy engine runs at 64 MiB/s, so that a cancel lands
  // while a staged transfer is still copying.
  virtual std::string Yaml() const {
    return "gpu:\n  backend: sim\n  count: 1\n  pool_size: 64MiB\n  sim_copy_rate: 64MiB\n";
  }
  void SetUp() override {
    ASSERT_TRUE(pair_.Start(Yaml()).ok());
    a_ = Connect(*pair_.a);
    b_ = Connect(*pair_.b);
  }
  void TearDown() override {
    a_ = {};
    b_ = {};
  }
  Pair pair_;
  Side a_, b_;
};

constexpr uint64_t kBlock = 32 << 10;

TEST_F(ClientMemoryTest, RegisteredHostMemoryMovesInPlaceBothWays) {
  SharedRegion mine(1 << 20), theirs(1 << 20);
  mine.Fill(1);
  theirs.Fill(2);
  auto reg_a = a_.client->RegisterMemory(mine.data, mine.bytes);
  ASSERT_TRUE(reg_a.ok()) << reg_a.status();
  EXPECT_TRUE(reg_a->buffer().registered());
  EXPECT_FALSE(reg_a->existing());
  auto reg_b = b_.client->RegisterMemory(theirs.data, theirs.bytes, "theirs");
  ASSERT_TRUE(reg_b.ok()) << reg_b.status();

  // The same range again: the same registration.
  auto again = a_.client->RegisterMemory(mine.data, mine.bytes);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->existing());
  EXPECT_EQ(again->buffer().id(), reg_a->buffer().id());
  // ... but not under another name: one registration, one way to reach it.
  auto renamed = a_.client->RegisterMemory(mine.data, mine.bytes, "mine");
  ASSERT_FALSE(renamed.ok());
  EXPECT_EQ(renamed.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(renamed.status().message(), HasSubstr("registered already"));
  auto info = a_.client->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->registered_bytes(), mine.bytes);
  EXPECT_EQ(info->host_pool_used_bytes(), 0u) << "registered memory is not the pool's";

  // WRITE the first half into theirs, READ their second half into ours.
  std::vector<char> want_theirs(theirs.data, theirs.data + theirs.bytes);
  std::vector<char> want_mine(mine.data, mine.data + mine.bytes);
  std::memcpy(want_theirs.data(), mine.data, 512 << 10);
  std::memcpy(want_mine.data() + (512 << 10), theirs.data + (512 << 10), 512 << 10);
  OpSpec w{ferry::v1::WRITE, reg_a->buffer().id(), 0, "node-b", "theirs", 0, 512 << 10};
  OpSpec r{ferry::v1::READ, reg_a->buffer().id(), 512 << 10, "node-b", "theirs", 512 << 10,
           512 << 10};
  auto result = a_.client->Run({w});
  ASSERT_TRUE(result.ok()) << result.status();
  result = a_.client->Run({r});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(std::memcmp(theirs.data, want_theirs.data(), theirs.bytes), 0);
  EXPECT_EQ(std::memcmp(mine.data, want_mine.data(), mine.bytes), 0);

  // Deregistered: later transfers are refused, naming the buffer.
  ASSERT_TRUE(a_.client->DeregisterMemory(reg_a->buffer().id()).ok());
  auto refused = a_.client->Run({w});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(refused.status().message(), HasSubstr("local_buffer"));
}

TEST_F(ClientMemoryTest, PrivateOrUnshareableMemoryIsRefusedWithWhatToDo) {
  std::vector<char> heap(1 << 20, 1);
  auto r = a_.client->RegisterMemory(heap.data(), heap.size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("private"));
  EXPECT_THAT(r.status().message(), HasSubstr("share_memory_()"));

  // A pipe is no memory; a range past the file's end is refused by the agent.
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  auto piped = a_.client->RegisterFd(p[0], 0, 4096);
  // For a GPU, a descriptor that is not a file goes to the backend as a VMM handle would
  // (CUDA's is the driver's device): the simulated GPU takes only its allocations' files.
  auto piped_gpu = a_.client->RegisterFd(p[0], 0, 4096, "cuda:0");
  close(p[0]);
  close(p[1]);
  ASSERT_FALSE(piped.ok());
  EXPECT_EQ(piped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(piped.status().message(), HasSubstr("fd_ticket"));
  ASSERT_FALSE(piped_gpu.ok());
  EXPECT_EQ(piped_gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(piped_gpu.status().message(), HasSubstr("not a simulated VMM allocation"));
  SharedRegion small(64 << 10);
  auto past = a_.client->RegisterFd(small.fd.get(), 32 << 10, 64 << 10);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(past.status().message(), HasSubstr("length"));

  // A ticket is good once.
  auto ticket = PassFd(pair_.a->socket() + ".fd", small.fd.get());
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ferry::v1::RegisterMemoryRequest req;
  req.set_fd_ticket(*ticket);
  req.set_length(small.bytes);
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    a_.session->Attach(&ctx);
    ferry::v1::RegisterMemoryResponse resp;
    grpc::Status s = a_.client->stub().RegisterMemory(&ctx, req, &resp);
    if (i == 0) {
      EXPECT_TRUE(s.ok()) << s.error_message();
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
      EXPECT_THAT(s.error_message(), HasSubstr("fd_ticket"));
    }
  }
  // Agent buffers and registrations end by their own calls.
  auto buf = a_.client->Alloc(4096);
  ASSERT_TRUE(buf.ok());
  absl::Status wrong = a_.client->DeregisterMemory((*buf)->id());
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
}

// A prefill side exports its K/V layers as one named list; the decode side pulls scattered
// blocks of every layer in one MoveBlocks call and notifies the prefill side.
TEST_F(ClientMemoryTest, ReadBlocksPullsScatteredBlocksAndNotifiesThePeer) {
  constexpr int kLayers = 4, kPerTensor = 16;  // 4 layers x {K, V}
  std::vector<std::unique_ptr<SharedRegion>> prefill, decode;
  std::vector<ferry::v1::BlockExtent> pe, de;
  for (int t = 0; t < kLayers * 2; ++t) {
    prefill.push_back(std::make_unique<SharedRegion>(kPerTensor * kBlock));
    prefill.back()->Fill(100 + t);
    decode.push_back(std::make_unique<SharedRegion>(kPerTensor * kBlock));
    auto rp = a_.client->RegisterMemory(prefill.back()->data, prefill.back()->bytes,
                                        absl::StrCat("kv.", t));
    ASSERT_TRUE(rp.ok()) << rp.status();
    pe.push_back(Extent(rp->buffer().id(), 0, kBlock, kPerTensor));
    auto rd = b_.client->RegisterMemory(decode.back()->data, decode.back()->bytes);
    ASSERT_TRUE(rd.ok()) << rd.status();
    de.push_back(Extent(rd->buffer().id(), 0, kBlock, kPerTensor));
  }
  auto exported = a_.blocks->Prepare(pe, "kv");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->blocks(), kLayers * 2 * kPerTensor);
  auto local = b_.blocks->Prepare(de);
  ASSERT_TRUE(local.ok()) << local.status();

  // The request's blocks 3, 7 and 12 of every tensor, into decode's 0, 1, 2.
  std::vector<uint64_t> remote_ids, local_ids;
  for (int t = 0; t < kLayers * 2; ++t) {
    for (auto [from, to] : {std::pair{3, 0}, {7, 1}, {12, 2}}) {
      remote_ids.push_back(t * kPerTensor + from);
      local_ids.push_back(t * kPerTensor + to);
    }
  }
  auto moved = b_.blocks->Move(ferry::v1::READ, local->list(), local_ids, "node-a", "kv",
                               remote_ids, "req-1 pulled", 0, false, false,
                               std::string("req-1\0blocks 3,7,12", 18));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->bytes(), local_ids.size() * kBlock);
  ferry::v1::TransferResult done = AwaitByPoll(*b_.client, moved->transfer_id());
  EXPECT_EQ(done.state(), ferry::v1::SUCCEEDED) << done.message();
  for (int t = 0; t < kLayers * 2; ++t) {
    for (auto [from, to] : {std::pair{3, 0}, {7, 1}, {12, 2}}) {
      EXPECT_EQ(std::memcmp(decode[t]->data + to * kBlock, prefill[t]->data + from * kBlock,
                            kBlock),
                0)
          << "tensor " << t << " block " << from;
    }
  }
  // The prefill side learns its blocks were pulled.
  CallOptions o;
  o.timeout = absl::Seconds(10);
  auto note = a_.tensors->WaitNotification("req-1 pulled", "node-b", o);
  ASSERT_TRUE(note.ok()) << note.status();
  EXPECT_EQ(note->blocks(), local_ids.size());
  EXPECT_EQ(note->bytes(), local_ids.size() * kBlock);
  EXPECT_EQ(note->payload(), std::string("req-1\0blocks 3,7,12", 18));  // bytes, as given

  // WRITE the other way: decode's block 0 of tensor 0 into prefill's block 15.
  auto pushed = b_.blocks->Move(ferry::v1::WRITE, local->list(), {0}, "node-a", "kv", {15});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(AwaitByPoll(*b_.client, pushed->transfer_id()).state(), ferry::v1::SUCCEEDED);
  EXPECT_EQ(std::memcmp(prefill[0]->data + 15 * kBlock, decode[0]->data, kBlock), 0);
}

TEST_F(ClientMemoryTest, BadBlockRequestsAreRefusedNamingTheField) {
  SharedRegion p(8 * kBlock), d(8 * kBlock);
  auto rp = a_.client->RegisterMemory(p.data, p.bytes, "p");
  auto rd = b_.client->RegisterMemory(d.data, d.bytes);
  ASSERT_TRUE(rp.ok() && rd.ok());
  // An exported list needs named buffers; extents must fit.
  auto unnamed = b_.blocks->Prepare({Extent(rd->buffer().id(), 0, kBlock, 8)}, "dl");
  ASSERT_FALSE(unnamed.ok());
  EXPECT_THAT(unnamed.status().message(), HasSubstr("extents[0].buffer"));
  auto too_many = a_.blocks->Prepare({Extent(rp->buffer().id(), 0, kBlock, 9)}, "pl");
  ASSERT_FALSE(too_many.ok());
  EXPECT_THAT(too_many.status().message(), HasSubstr("extents[0].count"));
  auto list_a = a_.blocks->Prepare({Extent(rp->buffer().id(), 0, kBlock, 8)}, "pl");
  ASSERT_TRUE(list_a.ok()) << list_a.status();
  auto list_b = b_.blocks->Prepare({Extent(rd->buffer().id(), 0, kBlock, 8)});
  ASSERT_TRUE(list_b.ok()) << list_b.status();
  auto halves = b_.blocks->Prepare({Extent(rd->buffer().id(), 0, kBlock / 2, 16)});
  ASSERT_TRUE(halves.ok()) << halves.status();

  auto expect = [](const absl::StatusOr<ferry::v1::MoveBlocksResponse>& r, absl::StatusCode code,
                   const std::string& field) {
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(field));
  };
  const uint64_t lb = list_b->list();
  expect(b_.blocks->Move(ferry::v1::READ, lb, {8}, "node-a", "pl", {0}),
         absl::StatusCode::kInvalidArgument, "local_blocks[0]");
  expect(b_.blocks->Move(ferry::v1::READ, lb, {0, 1}, "node-a", "pl", {0, 8}),
         absl::StatusCode::kInvalidArgument, "remote_blocks[1]");
  // A notification's payload: at most 4096 bytes, over gRPC and the transfer socket alike.
  for (bool wait : {false, true}) {
    expect(b_.blocks->Move(ferry::v1::READ, lb, {0}, "node-a", "pl", {0}, "big", 0, false, wait,
                           std::string(4097, 'x')),
           absl::StatusCode::kInvalidArgument, "notification_payload: 4097 bytes");
  }
  // Blocks of 16 KiB here against 32 KiB there.
  expect(b_.blocks->Move(ferry::v1::READ, halves->list(), {0}, "node-a", "pl", {0}),
         absl::StatusCode::kInvalidArgument, "bytes");
  expect(b_.blocks->Move(ferry::v1::READ, lb, {0}, "node-a", "no-such-list", {0}),
         absl::StatusCode::kNotFound, "no-such-list");
  expect(b_.blocks->Move(ferry::v1::READ, lb, {0}, "node-z", "pl", {0}),
         absl::StatusCode::kNotFound, "peer");
  expect(b_.blocks->Move(ferry::v1::READ, lb + 1000, {0}, "node-a", "pl", {0}),
         absl::StatusCode::kNotFound, "list");
  // Another session's list is not this one's.
  Side other = Connect(*pair_.b);
  expect(other.blocks->Move(ferry::v1::READ, lb, {0}, "node-a", "pl", {0}),
         absl::StatusCode::kNotFound, "this session");

  // Deregistered memory under a list: the pair that names it fails, by index.
  auto list_b2 = b_.blocks->Prepare({Extent(rd->buffer().id(), 0, kBlock, 8)});
  ASSERT_TRUE(list_b2.ok());
  ASSERT_TRUE(b_.client->DeregisterMemory(rd->buffer().id()).ok());
  expect(b_.blocks->Move(ferry::v1::READ, list_b2->list(), {0}, "node-a", "pl", {0}),
         absl::StatusCode::kNotFound, "pairs[0]");
  // Released: gone from the peer's view too.
  ASSERT_TRUE(a_.blocks->Release(list_a->list()).ok());
  expect(b_.blocks->Move(ferry::v1::READ, lb, {0}, "node-a", "pl", {0}),
         absl::StatusCode::kNotFound, "pl");
}

// A range inside a client's VMM allocation (simulated: mapped whole, as the driver maps a
// handle): registered with the allocation's size, it moves the range's bytes; without the
// size, or with a host descriptor, the agent says which field is wrong.
TEST_F(ClientMemoryTest, ARangeOfAVmmAllocationRegistersWithTheAllocationsSize) {
  constexpr uint64_t kOffset = 3 << 20, kLength = 5 << 20;
  SharedRegion gpu_mem(16 << 20), host_mem(kLength);
  gpu_mem.Fill(9);
  // Refused first (a range registered already would be found before the GPU is asked).
  auto short_of_end = a_.client->RegisterFd(gpu_mem.fd.get(), kOffset, kLength, "cuda:0");
  ASSERT_FALSE(short_of_end.ok());
  EXPECT_EQ(short_of_end.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(short_of_end.status().message(), HasSubstr("allocation_size"));
  auto wrong = a_.client->RegisterCudaVmm(gpu_mem.fd.get(), 32 << 20, kOffset, kLength, "cuda:0");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(wrong.status().message(), HasSubstr("allocation_size"));
  auto host = a_.client->RegisterCudaVmm(host_mem.fd.get(), host_mem.bytes, 0, 4096, "host");
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(host.status().message(), HasSubstr("allocation_size"));
  EXPECT_FALSE(a_.client->RegisterCudaVmm(gpu_mem.fd.get(), 0, 0, 4096, "cuda:0").ok());
  auto reg = a_.client->RegisterCudaVmm(gpu_mem.fd.get(), gpu_mem.bytes, kOffset, kLength,
                                        "cuda:0", "vmm-range");
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->buffer().size(), kLength);
  auto dst = b_.client->RegisterMemory(host_mem.data, host_mem.bytes);
  ASSERT_TRUE(dst.ok()) << dst.status();
  auto theirs = a_.blocks->Prepare({Extent(reg->buffer().id(), 0, kBlock, kLength / kBlock)},
                                   "vmm-kv");
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  auto ours = b_.blocks->Prepare({Extent(dst->buffer().id(), 0, kBlock, kLength / kBlock)});
  ASSERT_TRUE(ours.ok()) << ours.status();
  std::vector<uint64_t> all(kLength / kBlock);
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  auto moved = b_.blocks->Move(ferry::v1::READ, ours->list(), all, "node-a", "vmm-kv", all);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(AwaitByPoll(*b_.client, moved->transfer_id()).state(), ferry::v1::SUCCEEDED);
  EXPECT_EQ(std::memcmp(host_mem.data, gpu_mem.data + kOffset, kLength), 0);

  ASSERT_TRUE(a_.blocks->Release(theirs->list()).ok());
  ASSERT_TRUE(b_.blocks->Release(ours->list()).ok());
  ASSERT_TRUE(a_.client->DeregisterMemory(reg->buffer().id()).ok());
  auto info = a_.client->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->registered_bytes(), 0u) << "the refused registrations left nothing behind";
}

// GPU memory the client allocated (a simulated GPU's, shared by fd as a VMM handle is on
// CUDA), staged through the copy engine at a set rate, so that a cancel lands mid-transfer.
TEST_F(ClientMemoryTest, SimGpuRegistrationMovesAndCancelsMidTransfer) {
  SharedRegion gpu_mem(16 << 20), host_mem(16 << 20);
  gpu_mem.Fill(7);
  auto reg = a_.client->RegisterFd(gpu_mem.fd.get(), 0, gpu_mem.bytes, "cuda:0", "g");
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->buffer().device(), "cuda:0");
  EXPECT_EQ(reg->buffer().backend(), "sim");
  auto dst = b_.client->RegisterMemory(host_mem.data, host_mem.bytes);
  ASSERT_TRUE(dst.ok()) << dst.status();
  auto src_list = a_.blocks->Prepare({Extent(reg->buffer().id(), 0, kBlock, 512)}, "gpu-kv");
  ASSERT_TRUE(src_list.ok()) << src_list.status();
  auto dst_list = b_.blocks->Prepare({Extent(dst->buffer().id(), 0, kBlock, 512)});
  ASSERT_TRUE(dst_list.ok()) << dst_list.status();

  // A few blocks first, all through: bytes from the GPU land.
  auto small = b_.blocks->Move(ferry::v1::READ, dst_list->list(), {0, 1}, "node-a", "gpu-kv",
                               {10, 20});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(AwaitByPoll(*b_.client, small->transfer_id()).state(), ferry::v1::SUCCEEDED);
  EXPECT_EQ(std::memcmp(host_mem.data, gpu_mem.data + 10 * kBlock, kBlock), 0);
  EXPECT_EQ(std::memcmp(host_mem.data + kBlock, gpu_mem.data + 20 * kBlock, kBlock), 0);

  // Staged (gdr never), 16 MiB at 64 MiB/s: ~250 ms; cancelled after 20.
  ASSERT_TRUE(a_.client->SetPolicy({{"gdr", "never"}}).ok());
  std::vector<uint64_t> all(512);
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  auto big = b_.blocks->Move(ferry::v1::READ, dst_list->list(), all, "node-a", "gpu-kv", all,
                             "big done");
  ASSERT_TRUE(big.ok()) << big.status();
  absl::SleepFor(absl::Milliseconds(20));
  auto cancelled = b_.client->Cancel(big->transfer_id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  ferry::v1::TransferResult end = AwaitByPoll(*b_.client, big->transfer_id(), true);
  EXPECT_EQ(end.state(), ferry::v1::FAILED);
  EXPECT_GT(end.ops_failed(), 0u);
  ASSERT_GT(end.ops_size(), 0);
  EXPECT_EQ(end.ops(0).code(), static_cast<int>(absl::StatusCode::kCancelled));
  // The notification still goes, saying how it ended.
  CallOptions o;
  o.timeout = absl::Seconds(10);
  auto note = a_.tensors->WaitNotification("big done", "node-b", o);
  ASSERT_FALSE(note.ok());
  EXPECT_EQ(note.status().code(), absl::StatusCode::kCancelled) << note.status();
  ASSERT_TRUE(a_.client->SetPolicy({}, true).ok());
}

// MoveBlocks with wait answers once the move ended, with its result; a move that outlasts
// the call is answered RUNNING just before the call's deadline, with the id to follow it by
// (a failed call would lose it).
TEST_F(ClientMemoryTest, WaitAnswersWhenTheMoveEndedOrRunningBeforeTheDeadline) {
  constexpr uint64_t kBlocks = 6144;  // 192 MiB: staged at 64 MiB/s, about 3 s
  SharedRegion gpu_mem(kBlocks * kBlock), host_mem(kBlocks * kBlock);
  gpu_mem.Fill(8);
  auto reg = a_.client->RegisterFd(gpu_mem.fd.get(), 0, gpu_mem.bytes, "cuda:0", "slow");
  ASSERT_TRUE(reg.ok()) << reg.status();
  auto dst = b_.client->RegisterMemory(host_mem.data, host_mem.bytes);
  ASSERT_TRUE(dst.ok()) << dst.status();
  auto src_list = a_.blocks->Prepare({Extent(reg->buffer().id(), 0, kBlock, kBlocks)}, "slow-kv");
  ASSERT_TRUE(src_list.ok()) << src_list.status();
  auto dst_list = b_.blocks->Prepare({Extent(dst->buffer().id(), 0, kBlock, kBlocks)});
  ASSERT_TRUE(dst_list.ok()) << dst_list.status();

  auto one = b_.blocks->Move(ferry::v1::READ, dst_list->list(), {0}, "node-a", "slow-kv", {5},
                             "", 0, false, /*wait=*/true);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->result().state(), ferry::v1::SUCCEEDED) << one->result().message();
  EXPECT_EQ(one->result().transfer_id(), one->transfer_id());
  EXPECT_EQ(one->result().bytes(), kBlock);
  EXPECT_EQ(std::memcmp(host_mem.data, gpu_mem.data + 5 * kBlock, kBlock), 0);

  ASSERT_TRUE(a_.client->SetPolicy({{"gdr", "never"}}).ok());
  ferry::v1::MoveBlocksRequest req;
  req.set_type(ferry::v1::READ);
  req.set_list(dst_list->list());
  req.set_peer("node-a");
  req.set_remote_list("slow-kv");
  for (uint64_t i = 0; i < kBlocks; ++i) {
    req.add_local_blocks(i);
    req.add_remote_blocks(i);
  }
  req.set_wait(true);
  auto stub = ferry::v1::Tensors::NewStub(b_.session->channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(1500)));
  b_.session->Attach(&ctx);
  ferry::v1::MoveBlocksResponse resp;
  const absl::Time asked = absl::Now();
  grpc::Status s = stub->MoveBlocks(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LT(absl::Now() - asked, absl::Milliseconds(1500));
  EXPECT_EQ(resp.result().state(), ferry::v1::RUNNING);
  ASSERT_NE(resp.transfer_id(), 0u);
  // Followed by the id it came back with.
  ASSERT_TRUE(b_.client->Cancel(resp.transfer_id()).ok());
  EXPECT_EQ(AwaitByPoll(*b_.client, resp.transfer_id()).state(), ferry::v1::FAILED);
  ASSERT_TRUE(a_.client->SetPolicy({}, true).ok());
}

// verify: after the move both agents checksum each pair's blocks (the peer's on its
// simulated GPU, read back through its copy engine). Two pairs that land in one block cannot
// both hold their source's bytes: the check fails the one (or both, if their bytes
// interleaved) by index, DATA_LOSS naming both checksums, and tells the peer so.
TEST_F(ClientMemoryTest, VerifyChecksumsEveryPairAndFailsThoseThatDiffer) {
  // 2 MiB: a VMM allocation is a multiple of the granularity.
  SharedRegion gpu_mem(2 << 20), host_mem(16 * kBlock);
  gpu_mem.Fill(11);
  auto reg = a_.client->RegisterFd(gpu_mem.fd.get(), 0, gpu_mem.bytes, "cuda:0", "vg");
  ASSERT_TRUE(reg.ok()) << reg.status();
  auto dst = b_.client->RegisterMemory(host_mem.data, host_mem.bytes);
  ASSERT_TRUE(dst.ok()) << dst.status();
  auto theirs = a_.blocks->Prepare({Extent(reg->buffer().id(), 0, kBlock, 16)}, "verify-kv");
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  auto ours = b_.blocks->Prepare({Extent(dst->buffer().id(), 0, kBlock, 16)});
  ASSERT_TRUE(ours.ok()) << ours.status();
  CallOptions o;
  o.timeout = absl::Seconds(10);

  auto good = b_.blocks->Move(ferry::v1::READ, ours->list(), {0, 1, 2}, "node-a", "verify-kv",
                              {5, 9, 13}, "good", 0, /*verify=*/true);
  ASSERT_TRUE(good.ok()) << good.status();
  ferry::v1::TransferResult done = AwaitByPoll(*b_.client, good->transfer_id());
  EXPECT_EQ(done.state(), ferry::v1::SUCCEEDED) << done.message();
  EXPECT_EQ(done.bytes(), 3 * kBlock);
  for (auto [to, from] : {std::pair{0, 5}, {1, 9}, {2, 13}}) {
    EXPECT_EQ(std::memcmp(host_mem.data + to * kBlock, gpu_mem.data + from * kBlock, kBlock), 0);
  }
  EXPECT_TRUE(a_.tensors->WaitNotification("good", "node-b", o).ok());
  // Pushed the other way and checked on the GPU side.
  auto pushed = b_.blocks->Move(ferry::v1::WRITE, ours->list(), {1}, "node-a", "verify-kv", {15},
                                "", 0, true);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(AwaitByPoll(*b_.client, pushed->transfer_id()).state(), ferry::v1::SUCCEEDED);
  EXPECT_EQ(std::memcmp(gpu_mem.data + 15 * kBlock, host_mem.data + kBlock, kBlock), 0);

  // One block index twice on the landing side is refused before anything moves.
  auto twice = b_.blocks->Move(ferry::v1::READ, ours->list(), {7, 7}, "node-a", "verify-kv",
                               {1, 2});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(), HasSubstr("local_blocks[1]: block 7 is local_blocks[0]"));
  // A list that names the same memory twice (blocks 7 and 23) still collides. Unchecked it
  // passes for a success: the check is what catches it.
  auto aliased = b_.blocks->Prepare(
      {Extent(dst->buffer().id(), 0, kBlock, 16), Extent(dst->buffer().id(), 0, kBlock, 16)});
  ASSERT_TRUE(aliased.ok()) << aliased.status();
  auto unchecked = b_.blocks->Move(ferry::v1::READ, aliased->list(), {7, 23}, "node-a",
                                   "verify-kv", {1, 2});
  ASSERT_TRUE(unchecked.ok()) << unchecked.status();
  EXPECT_EQ(AwaitByPoll(*b_.client, unchecked->transfer_id()).state(), ferry::v1::SUCCEEDED);

  auto clash = b_.blocks->Move(ferry::v1::READ, aliased->list(), {7, 23, 8}, "node-a",
                               "verify-kv", {1, 2, 3}, "clash", 0, true);
  ASSERT_TRUE(clash.ok()) << clash.status();
  ferry::v1::TransferResult end = AwaitByPoll(*b_.client, clash->transfer_id(), true);
  EXPECT_EQ(end.state(), ferry::v1::FAILED);
  EXPECT_EQ(end.code(), static_cast<int>(absl::StatusCode::kDataLoss)) << end.message();
  EXPECT_GE(end.ops_failed(), 1u);
  EXPECT_LE(end.ops_failed(), 2u);
  EXPECT_EQ(end.bytes(), (3 - end.ops_failed()) * kBlock);  // failed pairs count no bytes
  for (const auto& op : end.ops()) {
    EXPECT_LT(op.index(), 2u) << "pair 2 (block 8) did not collide";
    EXPECT_EQ(op.code(), static_cast<int>(absl::StatusCode::kDataLoss));
    EXPECT_THAT(op.message(), HasSubstr(absl::StrCat("verify: the blocks differ: local block ",
                                                     op.index() == 0 ? 7 : 23, " has CRC32C")));
    EXPECT_THAT(op.message(), HasSubstr("node-a's block"));
  }
  EXPECT_EQ(std::memcmp(host_mem.data + 8 * kBlock, gpu_mem.data + 3 * kBlock, kBlock), 0);
  auto note = a_.tensors->WaitNotification("clash", "node-b", o);
  ASSERT_FALSE(note.ok());
  EXPECT_EQ(note.status().code(), absl::StatusCode::kDataLoss) << note.status();
}

// The peer's side of verify, spoken to directly as another node: what it refuses.
TEST_F(ClientMemoryTest, ChecksumBlocksRefusesWhatItMayNotAnswerNamingTheField) {
  SharedRegion mem(4 * kBlock);
  mem.Fill(3);
  auto reg = a_.client->RegisterMemory(mem.data, mem.bytes, "sums");
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_TRUE(a_.blocks->Prepare({Extent(reg->buffer().id(), 0, kBlock, 4)}, "sums").ok());
  auto stub = ferry::v1::TensorPeer::NewStub(
      PeerChannelAs(pair_.dir, pair_.a->peer_address(), "node-a", "node-b"));
  auto ask = [&](const std::string& list, std::vector<uint64_t> blocks,
                 ferry::v1::ChecksumBlocksResponse* resp) {
    ferry::v1::ChecksumBlocksRequest req;
    req.set_list(list);
    req.set_from_node("node-b");
    req.mutable_blocks()->Add(blocks.begin(), blocks.end());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->ChecksumBlocks(&ctx, req, resp);
  };
  ferry::v1::ChecksumBlocksResponse resp;
  grpc::Status s = ask("sums", {3, 0}, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.crc32c_size(), 2);
  EXPECT_EQ(resp.crc32c(0), Crc32c(mem.data + 3 * kBlock, kBlock));
  EXPECT_EQ(resp.crc32c(1), Crc32c(mem.data, kBlock));
  s = ask("sums", {0, 4}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("blocks[1]: 4 is out of range"));
  s = ask("nope", {0}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  s = ask("sums", std::vector<uint64_t>(65537, 0), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("blocks: 65537 is more than 65536"));
}

// GPU to GPU, staged on both sides, several pulls at once: the serving agent's bounce pool
// runs dry, and a fetch that waits for a chunk must not hold up the releases that would free
// one (four such pulls of 512 blocks once stopped until their deadline).
class StagedPullTest : public ClientMemoryTest {
 protected:
  // Copies as fast as memcpy: fetches outrun the pool.
  std::string Yaml() const override {
    return "gpu:\n  backend: sim\n  count: 1\n  pool_size: 64MiB\n";
  }
};

TEST_F(StagedPullTest, ConcurrentStagedPullsShareTheBouncePools) {
  ASSERT_TRUE(a_.client->SetPolicy({{"gdr", "never"}}).ok());
  ASSERT_TRUE(b_.client->SetPolicy({{"gdr", "never"}}).ok());
  SharedRegion src(16 << 20), dst(16 << 20);
  src.Fill(11);
  auto rs = a_.client->RegisterFd(src.fd.get(), 0, src.bytes, "cuda:0", "staged-src");
  auto rd = b_.client->RegisterFd(dst.fd.get(), 0, dst.bytes, "cuda:0");
  ASSERT_TRUE(rs.ok() && rd.ok()) << rs.status() << rd.status();
  auto exported = a_.blocks->Prepare({Extent(rs->buffer().id(), 0, kBlock, 512)}, "staged-kv");
  auto mine = b_.blocks->Prepare({Extent(rd->buffer().id(), 0, kBlock, 512)});
  ASSERT_TRUE(exported.ok() && mine.ok());
  std::vector<uint64_t> all(512);
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  std::vector<uint64_t> ids;
  for (int q = 0; q < 4; ++q) {
    auto moved = b_.blocks->Move(ferry::v1::READ, mine->list(), all, "node-a", "staged-kv",
                                 all, "", 30000);
    ASSERT_TRUE(moved.ok()) << moved.status();
    ids.push_back(moved->transfer_id());
  }
  for (uint64_t id : ids) {
    ferry::v1::TransferResult r = AwaitByPoll(*b_.client, id);
    EXPECT_EQ(r.state(), ferry::v1::SUCCEEDED) << r.message();
  }
  auto first = b_.client->Wait(ids[0], absl::Seconds(5), /*include_ops=*/true);
  ASSERT_TRUE(first.ok() && first->ops_size() > 0 && first->ops(0).legs_size() == 2);
  EXPECT_EQ(first->ops(0).legs(0).mode(), "staged");
  EXPECT_EQ(first->ops(0).legs(1).mode(), "staged");
  EXPECT_EQ(std::memcmp(src.data, dst.data, src.bytes), 0);
  ASSERT_TRUE(a_.client->SetPolicy({}, true).ok());
  ASSERT_TRUE(b_.client->SetPolicy({}, true).ok());
}

// A client that exits with registrations, lists and a waiting descriptor alive: the agent
// drops them all (the teardown's accounting check says so too).
TEST_F(ClientMemoryTest, ClientExitDropsItsRegistrationsAndLists) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execl(FERRY_SESSION_HELPER, FERRY_SESSION_HELPER, pair_.a->socket().c_str(), "3", "1048576",
          "register", nullptr);
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  ferry::v1::GetInfoResponse info;
  while (absl::Now() < deadline) {
    auto i = a_.client->GetInfo();
    ASSERT_TRUE(i.ok());
    info = *i;
    if (info.registered_bytes() == 0 && info.block_lists() == 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(info.registered_bytes(), 0u);
  EXPECT_EQ(info.block_lists(), 0u);
}

}  // namespace
}  // namespace ferry
