#include "server/local/buffer_lending.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace ferry::server {

absl::StatusOr<UniqueFd> LendBufferFile(const LocalCallers& callers, const BufferRegistry& buffers,
                                        uint64_t id, const ucred& caller) {
  const std::optional<LocalCaller> who = LocalCaller{caller.uid, caller.gid, caller.pid};
  const std::string what = absl::StrCat("buffer ", id, "'s memory");
  // The owner check first, then the lookup: MayUseBuffer lets an unknown id through.
  RETURN_IF_ERROR(MayUseBuffer(callers, who, buffers, id, what));
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, buffers.Get(id, "buffer"));
  return buffer->memory().LendFile();
}

}  // namespace ferry::server
