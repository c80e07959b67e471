#include "server/local/uid_quotas.h"

#include "absl/strings/str_cat.h"

namespace ferry::server {

absl::Status CheckUidQuota(const BufferRegistry& buffers, int64_t uid, bool registered,
                           uint32_t limit, absl::string_view key) {
  if (uid < 0 || limit == 0) return absl::OkStatus();
  uint64_t held = 0;
  for (const auto& b : buffers.List()) {
    if (b->owner_uid() == uid && b->memory().registered() == registered) ++held;
  }
  if (held < limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "uid ", uid, " holds ", held, registered ? " registrations" : " buffers", ", at most ",
      limit, " (", key, "): ", registered ? "deregister" : "free", " some first"));
}

}  // namespace ferry::server
