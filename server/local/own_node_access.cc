#include "server/local/own_node_access.h"

#include "absl/strings/str_cat.h"
#include "base/echo.h"

namespace ferry::server {

absl::Status MayReachOwnNodeBuffer(const LocalCallers& callers,
                                   const std::optional<LocalCaller>& caller,
                                   const BufferRegistry& buffers, const std::string& name,
                                   const std::string& field) {
  if (callers.SeesAll(caller)) return absl::OkStatus();
  auto buffer = buffers.FindByName(name);
  if (!buffer.ok()) return absl::OkStatus();
  return callers.MayUse(caller, (*buffer)->owner_uid(),
                        absl::StrCat(field, ": buffer ", Echo(name), " of this node"));
}

}  // namespace ferry::server
