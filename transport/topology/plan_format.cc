#include "transport/topology/plan_format.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ferry::topology {
namespace {

using config::PathClassName;

std::optional<int64_t> KnownNuma(int numa) {
  if (numa < 0) return std::nullopt;
  return numa;
}

std::string NumaCell(int numa) { return numa >= 0 ? absl::StrCat(numa) : "?"; }

std::string ListOrDash(const std::vector<std::string>& names) {
  return names.empty() ? "-" : absl::StrJoin(names, ",");
}

std::string PortsText(const Nic& nic) {
  if (nic.ports.empty()) return "ports unknown";
  std::vector<std::string> parts;
  for (const NicPort& port : nic.ports) {
    std::string text = absl::StrCat("port ", port.number, " ",
                                     port.state.empty() ? "?" : port.state);
    if (!port.link_layer.empty()) absl::StrAppend(&text, " ", port.link_layer);
    if (port.rate_gbps > 0) absl::StrAppend(&text, " ", port.rate_gbps, " Gb/s");
    parts.push_back(text);
  }
  return absl::StrJoin(parts, ", ");
}

// Left-aligned table with two spaces between columns.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, row[c]);
      if (c + 1 < row.size()) line.append(widths[c] - row[c].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

}  // namespace

std::string FormatPlanText(const Machine& machine, const TopologyPlan& plan) {
  std::string out = absl::StrCat("topology: ", machine.source, "\n");
  absl::StrAppend(&out, "policy: gdr=", config::GdrModeName(plan.policy.gdr),
                  " gdr_max_path=", PathClassName(plan.policy.gdr_max_path),
                  " fallback=", config::FallbackName(plan.policy.fallback), "\n");
  absl::StrAppend(&out, "nics.allow: ", ListOrDash(plan.nic_filter.allow),
                  "  nics.deny: ", ListOrDash(plan.nic_filter.deny),
                  "  provider: ", plan.provider, "\n\n");

  if (machine.gpus.empty()) {
    absl::StrAppend(&out, "no NVIDIA GPUs found\n");
  } else {
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> header = {""};
    for (const Nic& nic : machine.nics) header.push_back(nic.name);
    header.push_back("NUMA");
    header.push_back("PCI");
    rows.push_back(header);
    for (size_t g = 0; g < machine.gpus.size(); ++g) {
      std::vector<std::string> row = {absl::StrCat("GPU", g)};
      for (size_t n = 0; n < machine.nics.size(); ++n) {
        row.push_back(absl::StrCat(PathClassName(plan.paths[g][n]),
                                   plan.gpus[g].nic == static_cast<int>(n) ? "*" : ""));
      }
      row.push_back(NumaCell(machine.gpus[g].numa));
      row.push_back(machine.gpus[g].pci);
      rows.push_back(row);
    }
    absl::StrAppend(&out, Table(rows));
  }

  if (machine.nics.empty()) {
    absl::StrAppend(&out, "\nno RDMA NICs found\n");
  } else {
    std::vector<std::vector<std::string>> rows = {{"NIC", "PCI", "NUMA", "STATE", "PORTS"}};
    for (size_t n = 0; n < machine.nics.size(); ++n) {
      const Nic& nic = machine.nics[n];
      rows.push_back({nic.name, nic.pci.empty() ? "-" : nic.pci, NumaCell(nic.numa),
                      !plan.nics[n].selectable ? plan.nics[n].excluded
                      : plan.nics[n].host_only ? "selectable, host memory only"
                                               : "selectable",
                      PortsText(nic)});
    }
    absl::StrAppend(&out, "\n", Table(rows));
  }

  absl::StrAppend(&out,
                  "\n* = NIC chosen for the GPU. PIX: at most one PCIe bridge; PXB: several "
                  "bridges, not through the CPU; PHB: through a CPU root complex; NODE: "
                  "across root complexes of one NUMA node; SYS: across sockets.\n\n");
  for (const GpuDecision& d : plan.gpus) {
    absl::StrAppend(&out, "GPU", d.gpu, " ", TransferModeName(d.mode),
                    d.nic >= 0 ? absl::StrCat(" via ", machine.nics[d.nic].name) : "", ": ",
                    d.reason, "\n");
  }
  return out;
}

void WritePlanMembers(const Machine& machine, const TopologyPlan& plan, JsonWriter& json) {
  json.Key("source").String(machine.source);
  json.Key("provider").String(plan.provider);
  json.Key("policy").BeginObject();
  json.Key("gdr").String(config::GdrModeName(plan.policy.gdr));
  json.Key("gdr_max_path").String(PathClassName(plan.policy.gdr_max_path));
  json.Key("fallback").String(config::FallbackName(plan.policy.fallback));
  json.EndObject();
  json.Key("nic_filter").BeginObject();
  json.Key("allow").BeginArray();
  for (const std::string& name : plan.nic_filter.allow) json.String(name);
  json.EndArray();
  json.Key("deny").BeginArray();
  for (const std::string& name : plan.nic_filter.deny) json.String(name);
  json.EndArray();
  json.EndObject();

  json.Key("gpus").BeginArray();
  for (const GpuDecision& d : plan.gpus) {
    const Gpu& gpu = machine.gpus[d.gpu];
    json.BeginObject();
    json.Key("index").Int(gpu.index);
    json.Key("pci").String(gpu.pci);
    json.Key("numa").OptionalInt(KnownNuma(gpu.numa));
    if (d.nic >= 0) {
      json.Key("nic").String(machine.nics[d.nic].name);
      json.Key("path").String(PathClassName(*d.path));
    } else {
      json.Key("nic").Null();
      json.Key("path").Null();
    }
    json.Key("gdr").Bool(d.mode == TransferMode::kGdr);
    json.Key("mode").String(TransferModeName(d.mode));
    if (d.mode == TransferMode::kStaged) {
      json.Key("bounce_numa").OptionalInt(KnownNuma(d.bounce_numa));
    } else {
      json.Key("bounce_numa").Null();
    }
    json.Key("reason").String(d.reason);
    json.Key("model").String(gpu.model);
    json.Key("cuda_ordinal").OptionalInt(gpu.cuda_ordinal >= 0
                                             ? std::optional<int64_t>(gpu.cuda_ordinal)
                                             : std::nullopt);
    json.EndObject();
  }
  json.EndArray();

  json.Key("nics").BeginArray();
  for (size_t n = 0; n < machine.nics.size(); ++n) {
    const Nic& nic = machine.nics[n];
    json.BeginObject();
    json.Key("name").String(nic.name);
    json.Key("pci").String(nic.pci);
    json.Key("numa").OptionalInt(KnownNuma(nic.numa));
    json.Key("selectable").Bool(plan.nics[n].selectable);
    if (plan.nics[n].selectable) {
      json.Key("excluded").Null();
    } else {
      json.Key("excluded").String(plan.nics[n].excluded);
    }
    json.Key("host_only").Bool(plan.nics[n].host_only);
    if (plan.nics[n].host_only) {
      json.Key("host_only_reason").String(plan.nics[n].host_only_reason);
    } else {
      json.Key("host_only_reason").Null();
    }
    json.Key("gpus").BeginArray();
    for (int g : plan.nics[n].gpus) json.Int(g);
    json.EndArray();
    json.Key("ports").BeginArray();
    for (const NicPort& port : nic.ports) {
      json.BeginObject();
      json.Key("port").Int(port.number);
      json.Key("state").String(port.state);
      json.Key("link_layer").String(port.link_layer);
      json.Key("rate_gbps").Double(port.rate_gbps);
      json.EndObject();
    }
    json.EndArray();
    json.EndObject();
  }
  json.EndArray();

  json.Key("paths").BeginObject();
  for (size_t g = 0; g < machine.gpus.size(); ++g) {
    json.Key(machine.gpus[g].pci).BeginObject();
    for (size_t n = 0; n < machine.nics.size(); ++n) {
      json.Key(machine.nics[n].name).String(PathClassName(plan.paths[g][n]));
    }
    json.EndObject();
  }
  json.EndObject();
}

std::string FormatPlanJson(const Machine& machine, const TopologyPlan& plan) {
  JsonWriter json;
  json.BeginObject();
  WritePlanMembers(machine, plan, json);
  json.EndObject();
  return json.str() + "\n";
}

}  // namespace ferry::topology
