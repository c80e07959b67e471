#pragma once
// What runs when a posted op is done (transport/fabric.h), apart so that helpers that join
// completions (parts_completion.h) need not see the whole fabric interface.

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"

namespace ferry::fabric {

// Runs exactly once per accepted op, on the provider's completion thread, never while the
// provider holds a lock. (One exception: if the connection breaks while a multi-part op is
// being posted, the completion may run on the posting thread; so never post while holding a
// lock the completion takes.) OK, or the reason it failed:
// PERMISSION_DENIED when the peer refused the op (key, range, access or export scope: the
// peer's memory is untouched; tcp and verbs cannot tell which, and their endpoint is broken
// afterwards), UNAVAILABLE when the connection broke.
using Completion = absl::AnyInvocable<void(absl::Status) &&>;

}  // namespace ferry::fabric
