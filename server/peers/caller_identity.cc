#include "server/peers/caller_identity.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/echo.h"
#include "grpc/grpc_security_constants.h"

namespace ferry::server {

absl::StatusOr<std::string> CallerNode(const grpc::ServerContext& ctx,
                                       const std::string& claimed) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return claimed;
  // DNS SANs only ("peer_dns"): an IP or URI SAN does not name a node.
  std::vector<std::string> names;
  for (const grpc::string_ref& name : auth->FindPropertyValues(GRPC_PEER_DNS_PROPERTY_NAME)) {
    names.emplace_back(name.data(), name.size());
  }
  if (names.empty()) {
    return absl::PermissionDeniedError(
        "the caller's certificate names no node (it needs a DNS subjectAltName)");
  }
  if (claimed.empty()) return names.front();
  for (const auto& name : names) {
    if (name == claimed) return name;
  }
  return absl::PermissionDeniedError(absl::StrCat("the message says it comes from ", Echo(claimed),
                                                  " but the caller's certificate names ",
                                                  absl::StrJoin(names, ", ")));
}

}  // namespace ferry::server
