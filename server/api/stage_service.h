#pragma once
// The target side of a staged write (the Peer Stage call): grants bounce chunks near the
// GPU's NIC as credits, copies each reported chunk into the GPU buffer, then grants the
// chunk again. Never more than `staging_depth` chunks are granted to one call, so a slow
// GPU (or a slow agent) holds the writer back instead of filling memory.

#include <functional>
#include <memory>

#include "ferry/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/buffers/buffer_registry.h"
#include "server/buffers/bounce_pools.h"
#include "server/engine/leg_planner.h"
#include "server/buffers/gpu_pools.h"
#include "server/policy/policy_store.h"

namespace ferry::server {

struct StageServiceDeps {
  BufferRegistry* buffers;
  GpuPools* gpus;
  BouncePools* bounce;
  PolicyStore* policies;
  // This agent's fabrics: the one of the writer's provider holds the keys we grant.
  std::vector<fabric::RailId> rails;
  // The NUMA node whose bounce chunks stage `buffer` through `rail` (the planner's choice).
  std::function<int(const Buffer& buffer, const PolicySnapshot&, const fabric::RailId& rail)>
      bounce_numa;
};

// Serves one Stage call until the writer closes it, it fails, or the call is cancelled.
grpc::Status ServeStage(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<ferry::v1::StageReply, ferry::v1::StageRequest>* stream,
    const StageServiceDeps& deps);

}  // namespace ferry::server
