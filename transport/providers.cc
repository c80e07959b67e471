#include "transport/providers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/verbs/rdma_core_api.h"
#include "transport/verbs/verbs_fabric.h"

namespace ferry::fabric {

absl::StatusOr<std::vector<std::unique_ptr<Fabric>>> CreateFabrics(
    const ProviderOptions& options, std::vector<std::string>* skipped) {
  std::vector<std::unique_ptr<Fabric>> fabrics;
  for (const std::string& name : options.providers) {
    absl::StatusOr<std::unique_ptr<Fabric>> made;
    if (name == "tcp") {
      auto tcp = tcp::TcpFabric::Create(options.tcp);
      if (tcp.ok()) {
        made = std::unique_ptr<Fabric>(std::move(*tcp));
      } else {
        made = tcp.status();
      }
    } else if (name == "verbs") {
      auto verbs = verbs::VerbsFabric::Create(options.verbs, verbs::RdmaCoreApi());
      if (verbs.ok()) {
        made = std::unique_ptr<Fabric>(std::move(*verbs));
      } else {
        made = verbs.status();
      }
    } else {
      made = absl::InvalidArgumentError(absl::StrCat("unknown provider '", name, "'"));
    }
    if (made.ok()) {
      fabrics.push_back(std::move(*made));
    } else if (skipped != nullptr) {
      skipped->push_back(absl::StrCat(name, " not used: ", made.status().message()));
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
