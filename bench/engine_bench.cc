// ferry-engine-bench: the agent's own cost per op, without a wire. The real TransferEngine,
// BufferRegistry and PeerDirectory drive an in-process fabric that moves bytes with memcpy
// (tests/fakes/fake_fabric.h) to a peer reached through a local gRPC Peer service; each batch
// of blocks is one Submit. The peer's ResolveBuffer answer is revocable, as a real agent's
// is, so it is asked once and kept (server/peers/resolve_cache.h), as in the agent.
//
//   ferry-engine-bench [--blocks 4096] [--sizes 64,4096,16384] [--seconds 2]
//                      [--layout scattered|adjacent]
//
// scattered (the default): block i lands in slot blocks-1-i, so no two blocks are adjacent
// on both sides and each is its own fabric op; adjacent: block i lands in slot i, and the
// engine coalesces runs of them up to a slice (what consecutive KV blocks get).
// Prints per block size: wall ns per op, ops/s, and ops per CPU-second of this process (every
// thread: engine, fabric, gRPC), the "ops/s per core" figure.

#include <sys/resource.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "server/buffers/bounce_pools.h"
#include "server/buffers/buffer_registry.h"
#include "server/engine/transfer_engine.h"
#include "server/peers/peer_directory.h"
#include "server/policy/policy_store.h"
#include "spdlog/spdlog.h"
#include "tests/fakes/fake_fabric.h"
#include "tests/fakes/host_plan.h"
#include "tests/fakes/fake_peer_service.h"
#include "transport/memory/host_pool.h"
#include "transport/topology/machine.h"

namespace ferry::server {
namespace {

double CpuSeconds() {
  rusage u = {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct Options {
  int blocks = 4096;
  std::vector<uint64_t> sizes = {64, 4096, 16384};
  double seconds = 2;
  bool adjacent = false;
};

absl::StatusOr<Options> Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--blocks") {
      ok = absl::SimpleAtoi(value, &o.blocks) && o.blocks > 0 && o.blocks <= 65536;
    } else if (flag == "--seconds") {
      ok = absl::SimpleAtod(value, &o.seconds) && o.seconds > 0;
    } else if (flag == "--layout") {
      ok = value == "scattered" || value == "adjacent";
      o.adjacent = value == "adjacent";
    } else if (flag == "--sizes") {
      o.sizes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        uint64_t n = 0;
        ok = ok && absl::SimpleAtoi(s, &n) && n > 0;
        o.sizes.push_back(n);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat(flag, ": bad value '", value, "'"));
  }
  if (argc % 2 == 0) return absl::InvalidArgumentError("flags come in pairs: --flag value");
  return o;
}

int Run(const Options& o) {
  uint64_t largest = 0;
  for (uint64_t s : o.sizes) largest = std::max(largest, s);
  const uint64_t bytes = largest * o.blocks;
  fake::FakeFabric local{{.provider = "fake"}};
  fake::FakeFabric peer{{.provider = "fake"}};
  auto pool = memory::HostPool::Create(
      (bytes + memory::HostPool::kAlignment) / memory::HostPool::kAlignment *
          memory::HostPool::kAlignment,
      "ferry-engine-bench");
  if (!pool.ok()) return std::fprintf(stderr, "%s\n", pool.status().ToString().c_str()), 1;
  BufferRegistry registry((*pool).get(), nullptr, {&local});
  std::vector<char> landing(bytes);
  auto region = peer.Register(landing.data(), landing.size(),
                              fabric::kRemoteWrite | fabric::kRemoteRead);
  if (!region.ok()) return std::fprintf(stderr, "%s\n", region.status().ToString().c_str()), 1;
  fake::FakePeerService service("node-b", &peer, 0xb1);
  ferry::v1::ResolveBufferResponse exported;
  exported.set_size(bytes);
  exported.set_device("host");
  // As a real peer answers a caller it can revoke (peer_service.cc).
  exported.set_revocable(true);
  auto* key = exported.add_keys();
  key->set_provider("fake");
  key->set_address((*region)->remote_address());
  key->set_key((*region)->key());
  service.AddBuffer("landing", exported);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return std::fprintf(stderr, "cannot start the peer service\n"), 1;
  const std::string address = absl::StrCat("127.0.0.1:", port);
  PeerDirectory peers("node-a", 0xa1, address, {{"node-b", address}}, {&local});
  topology::Machine machine;
  auto policies = PolicyStore::Create(&machine, config::NicFilter{}, config::Policy{});
  if (!policies.ok()) return std::fprintf(stderr, "%s\n", policies.status().ToString().c_str()), 1;
  BouncePools bounce({&local}, nullptr);
  EngineDeps deps;
  deps.buffers = &registry;
  deps.peers = &peers;
  deps.policies = policies->get();
  deps.bounce = &bounce;
  deps.stage_calls = [](const StageCallSpec&, StageEvents*)
      -> absl::StatusOr<std::shared_ptr<StageCall>> {
    return absl::UnimplementedError("host memory only: nothing is staged");
  };
  deps.plan = fake::HostOnlyPlan;
  auto engine = std::make_unique<TransferEngine>(std::move(deps), EngineLimits{});
  auto src = registry.Allocate(bytes, "");
  if (!src.ok()) return std::fprintf(stderr, "%s\n", src.status().ToString().c_str()), 1;

  std::printf("ferry-engine-bench: the real engine over an in-process memcpy fabric, %d %s "
              "blocks per Submit\n\n%10s %8s %12s %14s %16s\n",
              o.blocks, o.adjacent ? "adjacent" : "scattered", "block", "batch", "ns/op", "ops/s",
              "ops/CPU-second");
  int rc = 0;
  for (uint64_t size : o.sizes) {
    ferry::v1::SubmitRequest batch;
    for (int i = 0; i < o.blocks; ++i) {
      ferry::v1::Op* op = batch.add_ops();
      op->set_type(ferry::v1::WRITE);
      op->set_local_buffer((*src)->id());
      op->set_local_offset(i * size);
      op->set_peer("node-b");
      op->set_remote_buffer("landing");
      op->set_remote_offset((o.adjacent ? i : o.blocks - 1 - i) * size);
      op->set_length(size);
    }
    uint64_t ops = 0;
    const double cpu_start = CpuSeconds();
    const absl::Time start = absl::Now();
    const absl::Time until = start + absl::Seconds(o.seconds);
    while (absl::Now() < until || ops == 0) {
      auto id = engine->Submit(batch);
      if (!id.ok()) return std::fprintf(stderr, "Submit: %s\n", id.status().ToString().c_str()), 1;
      auto t = engine->Find(*id);
      if (!t.ok() || !(*t)->AwaitFinished(absl::Now() + absl::Seconds(60))) {
        return std::fprintf(stderr, "transfer %lu did not finish\n", *id), 1;
      }
      ferry::v1::TransferResult r = (*t)->Result();
      if (r.state() != ferry::v1::SUCCEEDED) {
        std::fprintf(stderr, "transfer failed: %s\n", r.message().c_str());
        rc = 1;
        break;
      }
      ops += o.blocks;
    }
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    const double cpu = CpuSeconds() - cpu_start;
    std::printf("%10lu %8d %12.0f %14.0f %16.0f\n", size, o.blocks, wall * 1e9 / ops, ops / wall,
                cpu > 0 ? ops / cpu : 0.0);
  }
  engine.reset();
  peers.CloseAll();
  server->Shutdown(absl::ToChronoTime(absl::Now()));
  server->Wait();
  return rc;
}

}  // namespace
}  // namespace ferry::server

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);  // the agent's info lines would interleave the table
  // As ferryd runs (server/main.cc): without Abseil's lock-order graph.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  auto options = ferry::server::Parse(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "ferry-engine-bench: %s\n", options.status().ToString().c_str());
    return 2;
  }
  return ferry::server::Run(*options);
}
