// Fuzzes the validation of Agent API and Tensors requests with the server's own code: a real
// TransferEngine (BufferRegistry over a host pool, PeerDirectory reaching a fake peer agent
// over gRPC on 127.0.0.1, fake fabrics that record any access outside a region) and a real
// TensorState over them, as in tests/transfer_engine_test.cc. The first byte picks the
// request, the rest is its protobuf:
//   0: ferry.v1.SubmitRequest -> TransferEngine::Submit (what AgentService::Submit calls);
//   1: ferry.v1.WriteBlocksRequest -> TensorState::WriteBlocks (TensorService::WriteBlocks);
//   2: ferry.v1.SendRequest / 3: RecvRequest -> the tensor layout checks Send and Recv make
//      first (TensorSpanBytes, ParseDevice), without the rendezvous that follows.
// Invariants: no crash, leak or UB; an accepted Submit finishes before its deadline; the fake
// fabrics saw no op outside a registered region; every buffer is released afterwards.
// Seeds use the local buffer id 1 (64 KiB), peer "node-b" and its buffer "landing" (1 MiB).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/v1/agent.pb.h"
#include "ferry/v1/tensor.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/grpcpp.h"
#include "server/buffers/bounce_pools.h"
#include "server/buffers/buffer_registry.h"
#include "server/engine/transfer_engine.h"
#include "server/peers/peer_directory.h"
#include "server/policy/policy_store.h"
#include "server/tensors/tensor_meta.h"
#include "server/tensors/tensor_state.h"
#include "spdlog/spdlog.h"
#include "tests/fakes/fake_fabric.h"
#include "tests/fakes/fake_peer_service.h"
#include "tests/fakes/host_plan.h"
#include "transport/memory/host_pool.h"
#include "transport/topology/machine.h"

namespace ferry::server {
namespace {

constexpr uint64_t kLocalBytes = 64 << 10;
constexpr uint64_t kLanding = 1 << 20;

[[noreturn]] void Fail(const std::string& what) {
  fprintf(stderr, "requests_fuzz: %s\n", what.c_str());
  abort();
}

// Built once: a gRPC server and channel per input would make the fuzzer crawl.
struct World {
  World() {
    spdlog::set_level(spdlog::level::off);
    // Protobuf logs every string field with invalid UTF-8; the parse failing is the point.
    google::protobuf::SetLogHandler(nullptr);
    auto p = memory::HostPool::Create(64 * memory::HostPool::kAlignment, "requests_fuzz");
    if (!p.ok()) Fail(p.status().ToString());
    pool = std::move(*p);
    registry = std::make_unique<BufferRegistry>(pool.get(), nullptr,
                                                std::vector<fabric::Fabric*>{&local});
    auto b = registry->Allocate(kLocalBytes, "");
    if (!b.ok()) Fail(b.status().ToString());
    if ((*b)->id() != 1) Fail(absl::StrCat("the seeds expect local buffer 1, not ", (*b)->id()));
    baseline = pool->used();
    landing.assign(kLanding, 0);
    auto region = peer.Register(landing.data(), landing.size(),
                                fabric::kRemoteWrite | fabric::kRemoteRead);
    if (!region.ok()) Fail(region.status().ToString());
    landing_region = std::move(*region);
    service = std::make_unique<fake::FakePeerService>("node-b", &peer, 0xb1);
    ferry::v1::ResolveBufferResponse r;
    r.set_size(kLanding);
    r.set_device("host");
    auto* key = r.add_keys();
    key->set_provider("fake");
    key->set_address(landing_region->remote_address());
    key->set_key(landing_region->key());
    service->AddBuffer("landing", r);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    if (server == nullptr || port == 0) Fail("cannot start the fake peer");
    const std::string address = absl::StrCat("127.0.0.1:", port);
    peers = std::make_unique<PeerDirectory>(
        "node-a", 0xa1, address, std::map<std::string, std::string>{{"node-b", address}},
        std::vector<fabric::Fabric*>{&local});
    auto policy_store = PolicyStore::Create(&machine, config::NicFilter{}, config::Policy{});
    if (!policy_store.ok()) Fail(policy_store.status().ToString());
    policies = std::move(*policy_store);
    bounce = std::make_unique<BouncePools>(std::vector<fabric::Fabric*>{&local}, nullptr);
    EngineLimits limits;
    limits.slice_bytes = 64 << 10;
    limits.peer_window_bytes = 256 << 10;
    limits.max_op_bytes = kLanding;
    limits.max_ops_per_submit = 256;
    limits.default_timeout = absl::Seconds(2);
    limits.max_timeout = absl::Seconds(2);
    EngineDeps deps;
    deps.buffers = registry.get();
    deps.peers = peers.get();
    deps.policies = policies.get();
    deps.bounce = bounce.get();
    deps.stage_calls = [](const StageCallSpec&, StageEvents*)
        -> absl::StatusOr<std::shared_ptr<StageCall>> {
      return absl::UnimplementedError("host buffers only: nothing is staged");
    };
    deps.plan = fake::HostOnlyPlan;
    engine = std::make_unique<TransferEngine>(std::move(deps), limits);
    tensors = std::make_unique<TensorState>(peers.get(), registry.get(), engine.get(),
                                            limits.max_op_bytes);
  }

  std::unique_ptr<memory::HostPool> pool;
  fake::FakeFabric peer{{.provider = "fake"}};
  fake::FakeFabric local{{.provider = "fake"}};
  topology::Machine machine;
  std::unique_ptr<PolicyStore> policies;
  std::vector<char> landing;
  std::unique_ptr<fabric::MemoryRegion> landing_region;
  std::unique_ptr<BufferRegistry> registry;
  uint64_t baseline = 0;
  std::unique_ptr<BouncePools> bounce;
  std::unique_ptr<fake::FakePeerService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<PeerDirectory> peers;
  std::unique_ptr<TransferEngine> engine;
  std::unique_ptr<TensorState> tensors;
};

World& TheWorld() {
  static World* world = new World;  // never destroyed: libFuzzer exits from any thread
  return *world;
}

void Submit(World& w, const std::string& bytes) {
  ferry::v1::SubmitRequest req;
  if (!req.ParseFromString(bytes)) return;
  auto id = w.engine->Submit(req);
  if (!id.ok()) return;
  auto t = w.engine->Find(*id);
  if (!t.ok()) Fail("an accepted transfer is not found");
  if (!(*t)->AwaitFinished(absl::Now() + absl::Seconds(10))) {
    Fail("an accepted transfer did not end at its deadline");
  }
}

void WriteBlocks(World& w, const std::string& bytes) {
  ferry::v1::WriteBlocksRequest req;
  if (!req.ParseFromString(bytes)) return;
  (void)w.tensors->WriteBlocks(req, /*owner_uid=*/1000, absl::Now() + absl::Seconds(2), nullptr);
}

void Layout(const ferry::v1::TensorMeta& meta) {
  auto span = tensors::TensorSpanBytes(meta, "meta");
  if (span.ok()) (void)tensors::DescribeTensor(meta);
  (void)tensors::ParseDevice(meta.device(), "meta.device");
}

void Send(const std::string& bytes) {
  ferry::v1::SendRequest req;
  if (req.ParseFromString(bytes)) Layout(req.meta());
}

void Recv(const std::string& bytes) {
  ferry::v1::RecvRequest req;
  if (req.ParseFromString(bytes)) Layout(req.expect());
}

// Completions release their buffers just after they ran: bounded polling.
bool AwaitPoolUsed(World& w) {
  for (absl::Time give_up = absl::Now() + absl::Seconds(10); absl::Now() < give_up;) {
    if (w.pool->used() == w.baseline) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

}  // namespace
}  // namespace ferry::server

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::server;
  World& w = TheWorld();
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: Submit(w, rest); break;
    case 1: WriteBlocks(w, rest); break;
    case 2: Send(rest); break;
    case 3: Recv(rest); break;
  }
  for (const auto& v : ferry::fake::FakeFabric::ContractViolations()) Fail(v);
  if (!AwaitPoolUsed(w)) Fail("a buffer is still held after its transfer ended");
  return 0;
}
