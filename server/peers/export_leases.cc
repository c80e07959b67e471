#include "server/peers/export_leases.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

void ExportLeases::GrantIn(Holders& holders, const std::string& name, const std::string& node) {
  holders.by_name[name].insert(node);
  ++holders.granted[node];
}

void ExportLeases::TakeHolders(Holders& holders, const std::vector<std::string>& names,
                               std::vector<std::string> Dropped::*field,
                               std::map<std::string, Dropped>& by_node) {
  for (const std::string& name : names) {
    auto it = holders.by_name.find(name);
    if (it == holders.by_name.end()) continue;
    for (const std::string& node : it->second) (by_node[node].*field).push_back(name);
    holders.by_name.erase(it);
  }
}

size_t ExportLeases::HeldIn(const Holders& holders, const std::string& node) {
  size_t n = 0;
  for (const auto& [name, nodes] : holders.by_name) n += nodes.contains(node) ? 1 : 0;
  return n;
}

uint64_t ExportLeases::GrantedIn(const Holders& holders, const std::string& node) {
  auto it = holders.granted.find(node);
  return it == holders.granted.end() ? 0 : it->second;
}

void ExportLeases::Grant(const std::string& name, const std::string& node) {
  absl::MutexLock lock(&mu_);
  GrantIn(buffers_, name, node);
}

void ExportLeases::GrantList(const std::string& list, const std::string& node) {
  absl::MutexLock lock(&mu_);
  GrantIn(lists_, list, node);
}

void ExportLeases::Revoke(const std::vector<std::string>& names, const std::string& reason) {
  std::map<std::string, Dropped> by_node;
  {
    absl::MutexLock lock(&mu_);
    TakeHolders(buffers_, names, &Dropped::names, by_node);
  }
  Call(by_node, false, reason);
}

void ExportLeases::RevokeLists(const std::vector<std::string>& lists, const std::string& reason) {
  std::map<std::string, Dropped> by_node;
  {
    absl::MutexLock lock(&mu_);
    TakeHolders(lists_, lists, &Dropped::lists, by_node);
  }
  Call(by_node, false, reason);
}

void ExportLeases::RevokeAll(const std::string& reason) {
  std::map<std::string, Dropped> by_node;
  {
    absl::MutexLock lock(&mu_);
    for (Holders* holders : {&buffers_, &lists_}) {
      for (const auto& [name, nodes] : holders->by_name) {
        for (const std::string& node : nodes) by_node[node];
      }
      holders->by_name.clear();
    }
  }
  Call(by_node, true, reason);
}

size_t ExportLeases::HeldBy(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  return HeldIn(buffers_, node);
}

uint64_t ExportLeases::GrantedTo(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  return GrantedIn(buffers_, node);
}

size_t ExportLeases::ListsHeldBy(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  return HeldIn(lists_, node);
}

uint64_t ExportLeases::ListsGrantedTo(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  return GrantedIn(lists_, node);
}

void ExportLeases::Call(const std::map<std::string, Dropped>& by_node, bool all,
                        const std::string& reason) {
  if (by_node.empty()) return;
  const absl::Time deadline = absl::Now() + kRevokeTimeout;
  std::vector<std::thread> calls;
  for (const auto& held : by_node) {
    // Named here, not bound in the loop: clang 14 cannot capture a structured binding.
    const std::string& node = held.first;
    const Dropped& dropped = held.second;
    calls.emplace_back([this, &node, &dropped, all, &reason, deadline] {
      auto what = [&] {
        if (all) return std::string("everything");
        std::vector<std::string> parts;
        if (!dropped.names.empty()) parts.push_back(absl::StrJoin(dropped.names, ", "));
        if (!dropped.lists.empty()) {
          parts.push_back(absl::StrCat("list(s) ", absl::StrJoin(dropped.lists, ", ")));
        }
        return absl::StrJoin(parts, "; ");
      };
      auto stub = peers_->Stub(node);
      if (!stub.ok()) {
        spdlog::warn("revoke: cannot reach {} to drop its answers for {}: {}", node, what(),
                     stub.status().ToString());
        return;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      ferry::v1::RevokeRequest req;
      req.set_from_node(self_);
      for (const std::string& name : dropped.names) req.add_names(name);
      for (const std::string& list : dropped.lists) req.add_lists(list);
      req.set_all(all);
      req.set_reason(reason);
      ferry::v1::RevokeResponse resp;
      grpc::Status s = (*stub)->Revoke(&ctx, req, &resp);
      if (!s.ok()) {
        // It may still use a key it kept: tcp keys are random and the region is gone, so
        // its next access is refused; a verbs rkey may be issued again by the HCA.
        spdlog::warn("revoke ({}): {} did not confirm dropping its answers for {}: {}", reason,
                     node, what(), s.error_message());
      }
    });
  }
  for (auto& t : calls) t.join();
}

}  // namespace ferry::server
