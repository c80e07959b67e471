#include "server/agent/runtime_peers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/echo.h"
#include "config/config.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

absl::Status CheckNode(const PeerDirectory& peers, const std::string& node) {
  if (absl::Status valid = config::ValidateNodeName(node); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("node: ", valid.message()));
  }
  if (node == peers.self()) {
    return absl::InvalidArgumentError(
        absl::StrCat("node: ", Echo(node), " is this agent, not a peer"));
  }
  return absl::OkStatus();
}

ferry::v1::PeerChange ChangeOf(const PeerDirectory& peers, const std::string& node,
                               std::string change) {
  ferry::v1::PeerChange out;
  out.set_change(std::move(change));
  out.set_address(peers.AddressOf(node));
  if (auto source = peers.SourceOf(node)) out.set_source(std::string(PeerSourceName(*source)));
  return out;
}

}  // namespace

absl::StatusOr<ferry::v1::PeerChange> AddRuntimePeer(PeerDirectory& peers,
                                                     const ferry::v1::AddPeerRequest& req) {
  if (absl::Status valid = CheckNode(peers, req.node()); !valid.ok()) return valid;
  if (absl::Status valid = config::ValidateAddress(req.address(), /*allow_port_0=*/false);
      !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("address: ", valid.message()));
  }
  std::string change = peers.Upsert(req.node(), req.address(), PeerSource::kRuntime);
  if (!change.empty()) spdlog::info("AddPeer: {}", change);
  return ChangeOf(peers, req.node(), std::move(change));
}

absl::StatusOr<ferry::v1::PeerChange> RemoveRuntimePeer(PeerDirectory& peers,
                                                        const ferry::v1::RemovePeerRequest& req) {
  if (absl::Status valid = CheckNode(peers, req.node()); !valid.ok()) return valid;
  const std::vector<PeerSource> sources = peers.SourcesOf(req.node());
  if (sources.empty()) {
    return absl::NotFoundError(
        absl::StrCat("node: no peer named ", Echo(req.node()), " (known: ",
                     absl::StrJoin(peers.Names(), ", "), ")"));
  }
  if (std::find(sources.begin(), sources.end(), PeerSource::kRuntime) == sources.end()) {
    const bool configured =
        std::find(sources.begin(), sources.end(), PeerSource::kConfig) != sources.end();
    return absl::FailedPreconditionError(absl::StrCat(
        "node: peer ", Echo(req.node()), " was not added at run time; ",
        configured ? "it is in the config file: remove it from `peers` there and reload (SIGHUP)"
                   : "it was found in etcd: it goes when it deregisters or its lease lapses"));
  }
  std::string change = peers.Remove(req.node(), PeerSource::kRuntime);
  spdlog::info("RemovePeer: {}", change);
  return ChangeOf(peers, req.node(), std::move(change));
}

}  // namespace ferry::server
