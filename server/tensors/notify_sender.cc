#include "server/tensors/notify_sender.h"

#include "base/grpc_status.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "server/tensors/peer_call.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

void NotifySender::Send(const std::string& node, ferry::v1::Notification n) {
  absl::MutexLock lock(&mu_);
  // A hook of a transfer that ends as the agent stops: the directory may be gone already.
  if (stopping_) return;
  n.set_from_node(peers_->self());
  queue_.emplace_back(node, std::move(n));
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

void NotifySender::Stop() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

size_t NotifySender::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size() + sending_;
}

void NotifySender::Run() {
  while (true) {
    std::pair<std::string, ferry::v1::Notification> next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing left to deliver
      next = std::move(queue_.front());
      queue_.pop_front();
      ++sending_;
    }
    const auto& [node, n] = next;
    absl::Status delivered;
    auto channel = peers_->Channel(node);
    if (!channel.ok()) {
      delivered = channel.status();
    } else {
      auto stub = ferry::v1::TensorPeer::NewStub(*std::move(channel));
      ferry::v1::NotifyResponse resp;
      auto ctx = PeerContext(absl::Now() + kNotifyTimeout);
      delivered = FromGrpcStatus(stub->Notify(ctx.get(), n, &resp));
    }
    if (!delivered.ok()) {
      spdlog::warn("notification '{}' to {} not delivered: {}", n.name(), node,
                   delivered.ToString());
    }
    absl::MutexLock lock(&mu_);
    --sending_;
  }
}

}  // namespace ferry::server
