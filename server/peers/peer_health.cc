#include "server/peers/peer_health.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace ferry::server {

PeerHealth::PeerHealth(PeerDirectory* peers, absl::Duration interval)
    : peers_(peers), interval_(interval) {
  thread_ = std::thread([this] { Run(); });
}

PeerHealth::~PeerHealth() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void PeerHealth::Run() {
  while (true) {
    const absl::Time round = absl::Now();
    for (const std::string& node : peers_->Names()) {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      CheckOne(node);
    }
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithDeadline(absl::Condition(&stop), round + interval_);
    if (stopping_) return;
  }
}

void PeerHealth::CheckOne(const std::string& node) {
  PeerCheck result;
  result.checked = true;
  auto stub = peers_->Stub(node);
  const absl::Time start = absl::Now();
  if (!stub.ok()) {
    result.last_error = std::string(stub.status().message());
  } else {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(start + interval_));
    ferry::v1::HealthRequest req;
    ferry::v1::HealthResponse resp;
    grpc::Status s = (*stub)->Health(&ctx, req, &resp);
    if (s.ok() && resp.node() == node) {
      result.healthy = true;
      result.rtt = absl::Now() - start;
      result.incarnation = resp.incarnation();
    } else if (s.ok()) {
      result.last_error = absl::StrCat("the agent there calls itself '", resp.node(), "'");
    } else {
      result.last_error = absl::StrCat("Health: ", s.error_message());
    }
  }
  result.checked_at = absl::Now();
  absl::MutexLock lock(&mu_);
  PeerCheck& kept = checks_[node];
  result.last_ok = result.healthy ? result.checked_at : kept.last_ok;
  if (!result.healthy && result.incarnation == 0) result.incarnation = kept.incarnation;
  kept = std::move(result);
}

std::map<std::string, PeerCheck> PeerHealth::Snapshot() const {
  std::map<std::string, PeerCheck> out;
  for (const std::string& node : peers_->Names()) out[node];
  absl::MutexLock lock(&mu_);
  for (auto& [node, check] : out) {
    auto it = checks_.find(node);
    if (it != checks_.end()) check = it->second;
  }
  return out;
}

}  // namespace ferry::server
