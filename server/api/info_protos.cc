#include "server/api/info_protos.h"

#include <variant>

#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

struct FillMapping {
  ferry::v1::BufferInfo* info;
  const std::string& fd_socket;
  void operator()(const HostMapping& m) const {
    info->mutable_shm()->set_fd_socket(fd_socket);
    info->mutable_shm()->set_offset(m.offset);
    info->mutable_shm()->set_length(m.length);
  }
  void operator()(const GpuMapping& m) const {
    auto* g = info->mutable_gpu();
    g->set_kind(m.exported.kind);
    g->set_handle(m.exported.handle);
    g->set_offset(m.exported.offset);
    g->set_length(m.exported.length);
    g->set_path(m.exported.path);
    g->set_pci(m.pci);
  }
};

}  // namespace

void DescribeBuffer(const Buffer& buffer, ferry::v1::BufferInfo* info) {
  info->set_owner(buffer.owner_label());
  info->set_persist(buffer.owner() == 0);
  for (const std::string& peer : buffer.allowed_peers()) info->add_allowed_peers(peer);
  info->set_id(buffer.id());
  info->set_name(buffer.name());
  info->set_size(buffer.size());
  info->set_device(buffer.device());
  info->set_backend(buffer.backend());
  info->set_registered(buffer.memory().registered());
  auto mapping = buffer.memory().mapping();
  if (mapping.ok()) {
    std::visit(FillMapping{info, buffer.fd_socket()}, *mapping);
  } else {
    // The buffer still moves through the agent; only mapping it into a client fails.
    spdlog::error("buffer {}: cannot export it for clients: {}", buffer.id(),
                  mapping.status().ToString());
  }
  for (const auto& attempt : buffer.attempts()) info->add_registrations(attempt.ToString());
}

void FillGpuInfo(const GpuPoolStats& stats, ferry::v1::GpuInfo* info) {
  info->set_index(stats.index);
  info->set_pci(stats.pci);
  info->set_backend(stats.backend);
  info->set_pool_bytes(stats.pool_bytes);
  info->set_pool_used_bytes(stats.used_bytes);
  info->set_pool_fragmentation(stats.fragmentation);
}

void FillBouncePool(const BouncePoolStats& stats, ferry::v1::BouncePoolInfo* info) {
  info->set_name(stats.name);
  info->set_numa(stats.numa);
  info->set_chunk_bytes(stats.chunk_bytes);
  info->set_chunks(stats.chunks);
  info->set_chunks_in_use(stats.chunks_in_use);
  info->set_peak_chunks_in_use(stats.peak_chunks_in_use);
  info->set_placement(stats.placement);
  info->set_policy_generation(stats.policy_generation);
}

}  // namespace ferry::server
