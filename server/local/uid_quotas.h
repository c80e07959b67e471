#pragma once
// What one local uid may hold (config `limits.per_uid_*`), checked when it asks for more:
// a refusal names the key, the limit and what the uid holds now, so that a client learns
// which of its own things to let go. Buffers are counted from the registry at the time of
// the call (Alloc and Register are not the hot path); running transfers are counted by the
// engine itself (EngineLimits::per_uid_transfers).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/buffers/buffer_registry.h"

namespace ferry::server {

// OK when `uid` (-1: not known, no limit) holds fewer than `limit` (0: no limit) buffers
// of the kind `registered` says (RegisterMemory's, or AllocBuffer's); RESOURCE_EXHAUSTED
// naming `key` else.
absl::Status CheckUidQuota(const BufferRegistry& buffers, int64_t uid, bool registered,
                           uint32_t limit, absl::string_view key);

}  // namespace ferry::server
