#include "transport/providers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/verbs/rdma_core_api.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_fabric.h"

namespace ferry::fabric {

namespace {

template <typename T>
absl::StatusOr<std::unique_ptr<Fabric>> AsFabric(absl::StatusOr<std::unique_ptr<T>> made) {
  if (!made.ok()) return made.status();
  return std::unique_ptr<Fabric>(std::move(*made));
}

// The options of each fabric `name` runs, one per NIC for verbs and for tcp rails.
std::vector<std::pair<std::string, absl::StatusOr<std::unique_ptr<Fabric>>>> MakeProvider(
    const ProviderOptions& options, const std::string& name) {
  std::vector<std::pair<std::string, absl::StatusOr<std::unique_ptr<Fabric>>>> out;
  if (name == "tcp") {
    if (options.tcp_rails.empty()) {
      out.emplace_back("tcp", AsFabric(tcp::TcpFabric::Create(options.tcp)));
    }
    for (const tcp::TcpOptions& rail : options.tcp_rails) {
      out.emplace_back(absl::StrCat("tcp rail ", rail.nic), AsFabric(tcp::TcpFabric::Create(rail)));
    }
  } else if (name == "verbs") {
    std::shared_ptr<verbs::VerbsApi> api = verbs::RdmaCoreApi();
    std::vector<std::string> devices = options.verbs_devices;
    if (!options.verbs.device.empty()) {
      devices = {options.verbs.device};
    } else if (devices.empty()) {
      absl::StatusOr<std::vector<std::string>> all = verbs::DeviceNames(*api);
      if (!all.ok()) {
        out.emplace_back("verbs", all.status());
        return out;
      }
      devices = *all;
    }
    for (const std::string& device : devices) {
      verbs::VerbsOptions one = options.verbs;
      one.device = device;
      out.emplace_back(absl::StrCat("verbs ", device),
                       AsFabric(verbs::VerbsFabric::Create(one, api)));
    }
  } else {
    out.emplace_back(name,
                     absl::InvalidArgumentError(absl::StrCat("unknown provider '", name, "'")));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Fabric>>> CreateFabrics(
    const ProviderOptions& options, std::vector<std::string>* skipped) {
  std::vector<std::unique_ptr<Fabric>> fabrics;
  for (const std::string& name : options.providers) {
    for (auto& [what, made] : MakeProvider(options, name)) {
      if (made.ok()) {
        fabrics.push_back(std::move(*made));
      } else if (skipped != nullptr) {
        skipped->push_back(absl::StrCat(what, " not used: ", made.status().message()));
      }
    }
  }
  if (fabrics.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no fabric provider can run here (", absl::StrJoin(options.providers, ", "), ")"));
  }
  return fabrics;
}

absl::StatusOr<std::string> SelectProvider(const std::vector<std::string>& ours,
                                           const std::vector<std::string>& theirs) {
  for (const std::string& p : ours) {
    if (std::find(theirs.begin(), theirs.end(), p) != theirs.end()) return p;
  }
  return absl::FailedPreconditionError(absl::StrCat("no common provider: we offer [",
                                                    absl::StrJoin(ours, ", "), "], the peer [",
                                                    absl::StrJoin(theirs, ", "), "]"));
}

}  // namespace ferry::fabric
