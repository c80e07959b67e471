#include "server/api/nic_info.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "server/agent/agent_core.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

void Describe(AgentCore& core, const fabric::Fabric& fabric,
              const std::vector<RailPeerCounters>& ledger, absl::Time now,
              ferry::v1::NicInfo* info) {
  const fabric::RailId rail = fabric.rail();
  info->set_rail(rail.ToString());
  info->set_provider(rail.provider);
  info->set_nic(rail.nic);
  info->set_address(fabric.address());
  absl::Status health = fabric.health();
  info->set_health(health.ok() ? "ok" : std::string(health.message()));
  const FabricRails& rails = core.rails();
  info->set_numa(rails.NumaOf(fabric));
  for (int g : rails.GpusOf(fabric)) info->add_gpus(absl::StrCat("cuda:", g));
  info->set_host(rails.CarriesHost(fabric));
  const fabric::Fabric::Served served = fabric.served();
  info->set_served_written_bytes(served.written_bytes);
  info->set_served_read_bytes(served.read_bytes);
  info->set_served_ops(served.ops);
  for (const RailPeerCounters& c : ledger) {
    if (c.rail != rail) continue;
    auto* peer = info->add_peers();
    peer->set_peer(c.peer);
    peer->set_bytes(c.bytes);
    peer->set_ops(c.ops);
    peer->set_errors(c.errors);
    peer->set_retries(c.retries);
    peer->set_state(c.state);
    if (c.state == "paused") {
      peer->set_paused_ms_left(
          static_cast<uint64_t>(absl::ToInt64Milliseconds(c.paused_until - now)));
    }
    // What broke the rail, not the last of its consequences (the flushes of the slices in
    // flight, the failed probes), and where its slices went meanwhile.
    std::string error = c.root_cause.empty() ? c.last_error : c.root_cause;
    if (!c.fallback.empty()) absl::StrAppend(&error, "; its slices go to ", c.fallback);
    peer->set_last_error(error);
  }
}

}  // namespace

void DescribeNics(AgentCore& core, ferry::v1::GetInfoResponse* info) {
  const absl::Time now = absl::Now();
  const std::vector<RailPeerCounters> ledger = core.engine().ledger().Snapshot(now);
  for (const auto& f : core.fabrics()) Describe(core, *f, ledger, now, info->add_nics());
}

absl::StatusOr<ferry::v1::SetNicStateResponse> SetNicState(
    AgentCore& core, const ferry::v1::SetNicStateRequest& req) {
  std::vector<fabric::Fabric*> matched;
  std::vector<std::string> known;
  for (const auto& f : core.fabrics()) {
    const fabric::RailId rail = f->rail();
    known.push_back(rail.ToString());
    if (req.nic() == rail.ToString() || (!rail.nic.empty() && req.nic() == rail.nic)) {
      matched.push_back(f.get());
    }
  }
  if (matched.empty()) {
    return absl::NotFoundError(absl::StrCat("nic: no rail or NIC named ", Echo(req.nic()),
                                            " (this agent runs ", absl::StrJoin(known, ", "), ")"));
  }
  const std::string why =
      req.reason().empty() ? "taken down by the operator"
                           : absl::StrCat("taken down by the operator: ", req.reason());
  for (fabric::Fabric* f : matched) {
    if (req.up()) {
      f->Resume();
    } else {
      RETURN_IF_ERROR(f->Suspend(why));
    }
    spdlog::warn("rail {} {}", f->rail().ToString(), req.up() ? "back in service" : why);
  }
  ferry::v1::SetNicStateResponse resp;
  const absl::Time now = absl::Now();
  const std::vector<RailPeerCounters> ledger = core.engine().ledger().Snapshot(now);
  for (fabric::Fabric* f : matched) Describe(core, *f, ledger, now, resp.add_nics());
  return resp;
}

}  // namespace ferry::server
