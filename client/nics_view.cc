#include "client/nics_view.h"

#include "client/ops_views.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ferry::client {
namespace {

std::string Carries(const ferry::v1::NicInfo& nic) {
  std::vector<std::string> what(nic.gpus().begin(), nic.gpus().end());
  if (nic.host()) what.push_back("host");
  return what.empty() ? "-" : absl::StrJoin(what, " ");
}

std::string Numa(const ferry::v1::NicInfo& nic) {
  return nic.numa() >= 0 ? absl::StrCat(nic.numa()) : "-";
}

}  // namespace

std::string FormatNics(const google::protobuf::RepeatedPtrField<ferry::v1::NicInfo>& nics) {
  constexpr const char* kRow = "%-14s %-8s %-4s %-16s %-10s %-10s %-10s %8s %5s %5s %s\n";
  std::string out = absl::StrFormat(kRow, "RAIL", "HEALTH", "NUMA", "CARRIES", "SERVED", "PEER",
                                    "SENT", "OPS", "ERR", "RETRY", "STATE");
  std::string errors;
  for (const auto& nic : nics) {
    const std::string health = nic.health() == "ok" ? "ok" : "down";
    const std::string served = HumanBytes(nic.served_written_bytes() + nic.served_read_bytes());
    if (nic.peers().empty()) {
      absl::StrAppendFormat(&out, kRow, nic.rail(), health, Numa(nic), Carries(nic), served, "-",
                            "-", "-", "-", "-", "-");
    }
    bool first = true;
    for (const auto& p : nic.peers()) {
      std::string state = p.state();
      if (p.state() == "paused") absl::StrAppend(&state, " ", p.paused_ms_left(), " ms");
      absl::StrAppendFormat(&out, kRow, first ? nic.rail() : "", first ? health : "",
                            first ? Numa(nic) : "", first ? Carries(nic) : "",
                            first ? served : "", p.peer(), HumanBytes(p.bytes()),
                            absl::StrCat(p.ops()), absl::StrCat(p.errors()),
                            absl::StrCat(p.retries()), state);
      first = false;
      if (!p.last_error().empty() && (p.state() == "paused" || p.state() == "probing")) {
        absl::StrAppend(&errors, "  ", nic.rail(), " to ", p.peer(), ": ", p.last_error(), "\n");
      }
    }
    if (nic.health() != "ok") absl::StrAppend(&errors, "  ", nic.rail(), ": ", nic.health(), "\n");
  }
  if (!errors.empty()) absl::StrAppend(&out, "\n", errors);
  return out;
}

std::string FormatNicSummary(const ferry::v1::NicInfo& nic) {
  uint64_t sent = 0;
  size_t paused = 0;
  for (const auto& p : nic.peers()) {
    sent += p.bytes();
    paused += p.state() == "paused" || p.state() == "probing";
  }
  std::string line = absl::StrCat(nic.rail(), " ", nic.health(), ", numa ", Numa(nic),
                                  ", carries ", Carries(nic), ", sent ", HumanBytes(sent),
                                  ", served ",
                                  HumanBytes(nic.served_written_bytes() +
                                                 nic.served_read_bytes()));
  if (paused > 0) absl::StrAppend(&line, ", paused for ", paused, " peer(s)");
  return line;
}

}  // namespace ferry::client
