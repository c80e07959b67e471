#include "server/peers/peer_health.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
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
    const std::vector<std::string> names = peers_->Names();
    // Peers removed since the last round: their channels and checks go.
    std::erase_if(channels_, [&](const auto& c) {
      return std::find(names.begin(), names.end(), c.first) == names.end();
    });
    for (const std::string& node : names) {
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

absl::StatusOr<ferry::v1::Peer::Stub*> PeerHealth::StubFor(const std::string& node,
                                                           const std::string& address) {
  Channel& c = channels_[node];
  if (!c.stub || c.address != address) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                     peers_->credentials().Dial(node, address, args));
    c.address = address;
    c.stub = ferry::v1::Peer::NewStub(channel);
  }
  return c.stub.get();
}

void PeerHealth::CheckOne(const std::string& node) {
  PeerCheck result;
  result.checked = true;
  std::optional<PeerDirectory::View> view = peers_->ViewOf(node);
  const absl::Time start = absl::Now();
  if (!view) {
    result.last_error = "no longer a peer";
  } else if (auto stub_or = StubFor(node, view->address); !stub_or.ok()) {
    result.last_error = std::string(stub_or.status().message());
  } else {
    ferry::v1::Peer::Stub* stub = *stub_or;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(start + interval_));
    ferry::v1::HealthRequest req;
    ferry::v1::HealthResponse resp;
    grpc::Status s = stub->Health(&ctx, req, &resp);
    if (s.ok() && resp.node() == node) {
      result.healthy = true;
      result.rtt = absl::Now() - start;
      result.incarnation = resp.incarnation();
      peers_->Answered(node, resp.incarnation());  // a restart drops what we kept of it
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
