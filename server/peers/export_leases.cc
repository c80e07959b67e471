#include "server/peers/export_leases.h"

#include <thread>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

void ExportLeases::Grant(const std::string& name, const std::string& node) {
  absl::MutexLock lock(&mu_);
  holders_[name].insert(node);
  ++granted_[node];
}

uint64_t ExportLeases::GrantedTo(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto it = granted_.find(node);
  return it == granted_.end() ? 0 : it->second;
}

void ExportLeases::Revoke(const std::vector<std::string>& names, const std::string& reason) {
  std::map<std::string, std::vector<std::string>> by_node;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& name : names) {
      auto it = holders_.find(name);
      if (it == holders_.end()) continue;
      for (const std::string& node : it->second) by_node[node].push_back(name);
      holders_.erase(it);
    }
  }
  Call(by_node, false, reason);
}

void ExportLeases::RevokeAll(const std::string& reason) {
  std::map<std::string, std::vector<std::string>> by_node;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, nodes] : holders_) {
      for (const std::string& node : nodes) by_node[node];
    }
    holders_.clear();
  }
  Call(by_node, true, reason);
}

size_t ExportLeases::HeldBy(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [name, nodes] : holders_) n += nodes.contains(node) ? 1 : 0;
  return n;
}

void ExportLeases::Call(const std::map<std::string, std::vector<std::string>>& by_node,
                        bool all, const std::string& reason) {
  if (by_node.empty()) return;
  const absl::Time deadline = absl::Now() + kRevokeTimeout;
  std::vector<std::thread> calls;
  for (const auto& held : by_node) {
    // Named here, not bound in the loop: clang 14 cannot capture a structured binding.
    const std::string& node = held.first;
    const std::vector<std::string>& names = held.second;
    calls.emplace_back([this, &node, &names, all, &reason, deadline] {
      auto stub = peers_->Stub(node);
      if (!stub.ok()) {
        spdlog::warn("revoke: cannot reach {} to drop its answers for {}: {}", node,
                     all ? "every buffer" : absl::StrJoin(names, ", "),
                     stub.status().ToString());
        return;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      ferry::v1::RevokeRequest req;
      req.set_from_node(self_);
      for (const std::string& name : names) req.add_names(name);
      req.set_all(all);
      req.set_reason(reason);
      ferry::v1::RevokeResponse resp;
      grpc::Status s = (*stub)->Revoke(&ctx, req, &resp);
      if (!s.ok()) {
        // It may still use a key it kept: tcp keys are random and the region is gone, so
        // its next access is refused; a verbs rkey may be issued again by the HCA.
        spdlog::warn("revoke ({}): {} did not confirm dropping its answers for {}: {}", reason,
                     node, all ? "every buffer" : absl::StrJoin(names, ", "),
                     s.error_message());
      }
    });
  }
  for (auto& t : calls) t.join();
}

}  // namespace ferry::server
