#include "server/tensors/notify_sender.h"

#include <algorithm>
#include <vector>

#include "base/grpc_status.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "server/tensors/peer_call.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

void NotifySender::Send(const std::string& node, ferry::v1::Notification n) {
  absl::MutexLock lock(&mu_);
  // A hook of a transfer that ends as the agent stops: the directory may be gone already.
  if (stopping_) return;
  std::unique_ptr<Lane>& lane = lanes_[node];
  if (!lane) lane = std::make_unique<Lane>();
  if (lane->queue.size() >= kMaxQueued) {
    spdlog::warn("notification '{}' to {} dropped: {} wait for that peer already", n.name(), node,
                 lane->queue.size());
    return;
  }
  n.set_from_node(peers_->self());
  lane->queue.push_back(std::move(n));
  if (!lane->thread.joinable()) {
    lane->thread = std::thread([this, node, l = lane.get()] { Run(node, l); });
  }
}

void NotifySender::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      stop_by_ = absl::Now() + kStopBudget;
    }
    for (auto& [node, lane] : lanes_) {
      if (lane->thread.joinable()) threads.push_back(std::move(lane->thread));
    }
  }
  for (std::thread& t : threads) t.join();
}

size_t NotifySender::pending() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [node, lane] : lanes_) n += lane->queue.size() + lane->sending;
  return n;
}

void NotifySender::Run(const std::string& node, Lane* lane) {
  while (true) {
    ferry::v1::Notification n;
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, lane]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !lane->queue.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (lane->queue.empty()) return;  // stopping, and nothing left to deliver
      if (absl::Now() >= stop_by_) {
        spdlog::warn("{} notification(s) to {} dropped: the agent is stopping", lane->queue.size(),
                     node);
        lane->queue.clear();
        return;
      }
      n = std::move(lane->queue.front());
      lane->queue.pop_front();
      ++lane->sending;
      deadline = std::min(absl::Now() + kNotifyTimeout, stop_by_);
    }
    absl::Status delivered;
    auto channel = peers_->Channel(node);
    if (!channel.ok()) {
      delivered = channel.status();
    } else {
      auto stub = ferry::v1::TensorPeer::NewStub(*std::move(channel));
      ferry::v1::NotifyResponse resp;
      auto ctx = PeerContext(deadline);
      delivered = FromGrpcStatus(stub->Notify(ctx.get(), n, &resp));
    }
    if (!delivered.ok()) {
      spdlog::warn("notification '{}' to {} not delivered: {}", n.name(), node,
                   delivered.ToString());
    }
    absl::MutexLock lock(&mu_);
    --lane->sending;
  }
}

}  // namespace ferry::server
