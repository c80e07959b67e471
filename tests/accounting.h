#pragma once
// The invariant every integration test ends with: once its clients are gone, an agent's
// accounting returns to zero. Nothing but buffers that persist is left, the host pool's
// used bytes are exactly those buffers', GPU pools hold only persisting GPU buffers, no
// bounce chunk is in use, and no client memory is registered, no block list or passed
// descriptor is left, no connection to the transfer socket is open; with no buffer left, no
// peer keeps an answer for one of its names or lists (ListPeers: answers_held, lists_held).
// Polls briefly: sessions end asynchronously when clients leave.

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/ferry_client.h"
#include "gtest/gtest.h"

namespace ferry {

inline void ExpectAccountingAtZero(const std::string& socket, const std::string& who) {
  auto probe = Client::Connect(socket, absl::Seconds(5), "accounting check");
  ASSERT_TRUE(probe.ok()) << who << ": " << probe.status();
  std::string last;
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    auto info = (*probe)->GetInfo();
    auto buffers = (*probe)->ListBuffers();
    ASSERT_TRUE(info.ok() && buffers.ok()) << who;
    ferry::v1::ListPeersResponse peers;
    grpc::ClientContext peers_ctx;
    ASSERT_TRUE((*probe)->stub().ListPeers(&peers_ctx, {}, &peers).ok()) << who;
    uint64_t held = 0;
    for (const auto& p : peers.peers()) held += p.answers_held() + p.lists_held();
    uint64_t persisting_gpu = 0;
    bool only_persisting = true;
    for (const auto& b : *buffers) {
      only_persisting &= b.persist();
      if (b.device() != "host") persisting_gpu += b.size();
    }
    uint64_t gpu_used = 0, bounce_in_use = 0;
    for (const auto& g : info->gpus()) gpu_used += g.pool_used_bytes();
    for (const auto& p : info->bounce_pools()) bounce_in_use += p.chunks_in_use();
    bool ok = info->sessions() == 1 && only_persisting && info->transfers_active() == 0 &&
              info->host_pool_used_bytes() == info->host_buffer_bytes() &&
              (persisting_gpu > 0 || gpu_used == 0) && bounce_in_use == 0 &&
              (!buffers->empty() || info->host_pool_used_bytes() == 0) &&
              info->registered_bytes() == 0 && info->block_lists() == 0 &&
              info->fds_waiting() == 0 && info->transfer_socket_clients() == 0 &&
              (!buffers->empty() || held == 0);
    if (ok) return;
    last = absl::StrCat(who, ": sessions ", info->sessions(), ", buffers ", buffers->size(),
                        only_persisting ? " (all persist)" : " (some owned by a session)",
                        ", host pool used ", info->host_pool_used_bytes(), " for buffers of ",
                        info->host_buffer_bytes(), ", GPU pools used ", gpu_used,
                        ", bounce chunks in use ", bounce_in_use, ", transfers running ",
                        info->transfers_active(), ", registered bytes ", info->registered_bytes(),
                        ", block lists ", info->block_lists(), ", descriptors waiting ",
                        info->fds_waiting(), ", transfer socket connections ",
                        info->transfer_socket_clients(), ", answers peers keep ", held);
    if (absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ADD_FAILURE() << "accounting did not return to zero: " << last;
}

}  // namespace ferry
