// test-rdma's KV block-list driver (guest-node-a step 2): two agents move a few hundred
// scattered blocks of a KV cache between block lists, READ and WRITE, as a prefill and a
// decode node would, over libferry's C++ client (Client, BlockClient, TensorClient). The
// guests have no Python; this is the smallest program that drives the real API.
//
//   rdma_kv_blocks export --list kv --peer node-a    (node-b: its list, then waits)
//   rdma_kv_blocks move   --list kv --peer node-b    (node-a: WRITE, then READ)
//
// Both sides make the same K and V cache (two extents of --blocks/2 blocks of --block-bytes
// in one buffer each) and the same pair sets from --seed: WRITE moves node-a's blocks
// local_w[i] into node-b's remote_w[i], READ pulls node-b's remote_r[i] into node-a's
// local_r[i], the four index sets shuffled and the two on each side disjoint. Each side
// fills its cache with its own pattern and prints the checksum (base/checksum.h over the
// blocks in pair order) of what it sent and of what landed, so the two guests' lines are
// compared without trusting either agent; the moves ask the agents' CRC32C check too.
//   export: prepares the list under --list and prints `ready read_src=H`; waits for the
//     notification "<list>/written" and prints `written landed=H`, then "<list>/read" and
//     prints `read done`; exits (its session, and the list, end).
//   move: prepares its list, WRITEs with that notification and prints `WRITE src=H ...`,
//     zeroes its READ blocks, READs and prints `READ back=H ...`; each line names the bytes,
//     the time and the rails the agent says carried the ops (the transfer's legs).
// Exits 0 when every step went well, 1 when one failed (it says which), 2 on a usage error.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/byte_size.h"
#include "base/checksum.h"
#include "base/status_macros.h"
#include "client/block_client.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"

namespace ferry {
namespace {

struct Options {
  std::string role, list = "kv", peer;
  uint64_t blocks = 512, block_bytes = 16 << 10, pairs = 200, seed = 43;
  absl::Duration timeout = absl::Seconds(120);
};

bool Parse(int argc, char** argv, Options* o) {
  if (argc < 2) return false;
  o->role = argv[1];
  if (o->role != "export" && o->role != "move") return false;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    int64_t seconds = 0;
    if (key == "--list") {
      o->list = value;
    } else if (key == "--peer") {
      o->peer = value;
    } else if (key == "--blocks" && absl::SimpleAtoi(value, &o->blocks)) {
    } else if (key == "--block-bytes" && ParseByteSize(value).ok()) {
      o->block_bytes = *ParseByteSize(value);
    } else if (key == "--pairs" && absl::SimpleAtoi(value, &o->pairs)) {
    } else if (key == "--seed" && absl::SimpleAtoi(value, &o->seed)) {
    } else if (key == "--timeout" && absl::SimpleAtoi(value, &seconds)) {
      o->timeout = absl::Seconds(seconds);
    } else {
      return false;
    }
  }
  // Two extents (K and V), and room for two disjoint pair sets on each side.
  return argc % 2 == 0 && !o->peer.empty() && o->blocks >= 2 && o->blocks % 2 == 0 &&
         o->pairs >= 1 && 2 * o->pairs <= o->blocks && o->block_bytes >= 1;
}

// The four index sets, the same on both guests (one seed, one generator whose sequence the
// standard fixes; the shuffle is written out because std::shuffle's is not fixed).
struct Pairs {
  std::vector<uint64_t> local_w, remote_w, local_r, remote_r;
};

std::vector<uint64_t> Shuffled(uint64_t n, std::mt19937_64& rng) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = i;
  for (uint64_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng() % (i + 1)]);
  return v;
}

Pairs MakePairs(const Options& o) {
  std::mt19937_64 rng(o.seed);
  const std::vector<uint64_t> local = Shuffled(o.blocks, rng), remote = Shuffled(o.blocks, rng);
  const auto part = [&](const std::vector<uint64_t>& v, uint64_t k) {
    return std::vector<uint64_t>(v.begin() + k * o.pairs, v.begin() + (k + 1) * o.pairs);
  };
  return {part(local, 0), part(remote, 0), part(local, 1), part(remote, 1)};
}

// Block b's bytes (the list's index b: K blocks, then V blocks, back to back in the buffer).
char* BlockAt(const Buffer& buffer, const Options& o, uint64_t b) {
  return buffer.data() + b * o.block_bytes;
}

// A side's own bytes: every 8-byte word from (salt, offset), so that no two blocks match.
void Fill(const Buffer& buffer, uint64_t salt) {
  std::mt19937_64 rng(salt);
  uint64_t i = 0;
  for (; i + 8 <= buffer.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(buffer.data() + i, &word, 8);
  }
  for (; i < buffer.size(); ++i) buffer.data()[i] = static_cast<char>(rng());
}

// The blocks' checksum in pair order, as 16 hex digits.
std::string SumOf(const Buffer& buffer, const Options& o, const std::vector<uint64_t>& blocks) {
  std::vector<uint64_t> each;
  each.reserve(blocks.size());
  for (uint64_t b : blocks) each.push_back(Checksum(BlockAt(buffer, o, b), o.block_bytes));
  return absl::StrFormat("%016x", Checksum(reinterpret_cast<const char*>(each.data()),
                                           each.size() * sizeof(uint64_t)));
}

// The K and V cache: one buffer, two extents of blocks/2 blocks.
absl::StatusOr<std::pair<std::unique_ptr<Buffer>, uint64_t>> MakeCache(
    Client& client, BlockClient& blocks, const Options& o, const std::string& buffer_name,
    const std::string& list_name, uint64_t salt) {
  const uint64_t half = o.blocks / 2;
  ASSIGN_OR_RETURN(auto buffer, client.Alloc(o.blocks * o.block_bytes, buffer_name));
  Fill(*buffer, salt);
  ASSIGN_OR_RETURN(auto list, blocks.Prepare({Extent(buffer->id(), 0, o.block_bytes, half),
                                              Extent(buffer->id(), half * o.block_bytes,
                                                     o.block_bytes, half)},
                                             list_name));
  if (list.blocks() != o.blocks) {
    return absl::InternalError(absl::StrCat("PrepareBlocks made ", list.blocks(), " blocks, not ",
                                            o.blocks));
  }
  return std::make_pair(std::move(buffer), list.list());
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

absl::Status Export(const Options& o) {
  ASSIGN_OR_RETURN(auto client, Client::Connect());
  BlockClient blocks(client.get());
  TensorClient tensors(client->shared_session());
  const Pairs p = MakePairs(o);
  ASSIGN_OR_RETURN(auto cache, MakeCache(*client, blocks, o, absl::StrCat(o.list, "-cache"),
                                         o.list, /*salt=*/o.seed * 2 + 1));
  Say(absl::StrCat("ready blocks=", o.blocks, " block_bytes=", o.block_bytes,
                   " read_src=", SumOf(*cache.first, o, p.remote_r)));
  CallOptions wait;
  wait.timeout = o.timeout;
  ASSIGN_OR_RETURN(auto written,
                   tensors.WaitNotification(absl::StrCat(o.list, "/written"), o.peer, wait));
  Say(absl::StrCat("written landed=", SumOf(*cache.first, o, p.remote_w),
                   " notified_blocks=", written.blocks(), " bytes=", written.bytes()));
  ASSIGN_OR_RETURN(auto read,
                   tensors.WaitNotification(absl::StrCat(o.list, "/read"), o.peer, wait));
  Say(absl::StrCat("read done notified_blocks=", read.blocks(), " bytes=", read.bytes()));
  return absl::OkStatus();
}

// One move, waited for; its line: bytes, time, and the rails its legs name.
absl::StatusOr<std::string> MoveAndDescribe(Client& client, BlockClient& blocks,
                                            const Options& o, ferry::v1::OpType type,
                                            uint64_t list, const std::vector<uint64_t>& local,
                                            const std::vector<uint64_t>& remote,
                                            const std::string& notification) {
  const absl::Time t0 = absl::Now();
  ASSIGN_OR_RETURN(auto moved,
                   blocks.Move(type, list, local, o.peer, o.list, remote, notification,
                               static_cast<uint32_t>(absl::ToInt64Milliseconds(o.timeout)),
                               /*verify=*/true, /*wait=*/true));
  const int64_t ms = absl::ToInt64Milliseconds(absl::Now() - t0);
  ASSIGN_OR_RETURN(auto result, client.Wait(moved.transfer_id(), o.timeout,
                                            /*include_ops=*/true));
  if (result.state() != ferry::v1::SUCCEEDED) {
    return absl::InternalError(absl::StrCat(ferry::v1::OpType_Name(type), " of ", local.size(),
                                            " blocks (transfer ", moved.transfer_id(),
                                            ") ended ", result.ShortDebugString()));
  }
  std::set<std::string> rails;
  for (const auto& op : result.ops()) {
    for (const auto& leg : op.legs()) rails.insert(leg.rails().begin(), leg.rails().end());
  }
  return absl::StrCat(local.size(), "_blocks bytes=", moved.bytes(), " ", ms,
                      "ms rails=", rails.empty() ? "-" : absl::StrJoin(rails, ","),
                      " transfer=", moved.transfer_id());
}

absl::Status Move(const Options& o) {
  ASSIGN_OR_RETURN(auto client, Client::Connect());
  BlockClient blocks(client.get());
  const Pairs p = MakePairs(o);
  ASSIGN_OR_RETURN(auto cache, MakeCache(*client, blocks, o, "", "", /*salt=*/o.seed * 2));
  const Buffer& buffer = *cache.first;
  const std::string src = SumOf(buffer, o, p.local_w);
  ASSIGN_OR_RETURN(std::string wrote,
                   MoveAndDescribe(*client, blocks, o, ferry::v1::WRITE, cache.second, p.local_w,
                                   p.remote_w, absl::StrCat(o.list, "/written")));
  Say(absl::StrCat("WRITE src=", src, " ", wrote));
  // What READ lands in starts as zeros, so stale bytes cannot pass for moved ones.
  for (uint64_t b : p.local_r) std::memset(BlockAt(buffer, o, b), 0, o.block_bytes);
  ASSIGN_OR_RETURN(std::string read,
                   MoveAndDescribe(*client, blocks, o, ferry::v1::READ, cache.second, p.local_r,
                                   p.remote_r, absl::StrCat(o.list, "/read")));
  Say(absl::StrCat("READ back=", SumOf(buffer, o, p.local_r), " ", read));
  return absl::OkStatus();
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ferry::Options o;
  if (!ferry::Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: rdma_kv_blocks export|move --peer NODE [--list NAME] [--blocks N]\n"
                 "         [--block-bytes SIZE] [--pairs N] [--seed N] [--timeout SECONDS]\n"
                 "  N even, 2 * pairs <= blocks; both sides need the same list, sizes and seed\n");
    return 2;
  }
  const absl::Status s = o.role == "export" ? ferry::Export(o) : ferry::Move(o);
  if (!s.ok()) {
    std::fprintf(stderr, "rdma_kv_blocks %s: %s\n", o.role.c_str(), s.ToString().c_str());
    std::printf("error %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
