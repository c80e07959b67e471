#pragma once
// The production binding of the verbs seam: straight calls into libibverbs.

#include <memory>

#include "transport/verbs/verbs_api.h"

namespace ferry::verbs {

// The process-wide rdma-core binding (stateless; shared by every fabric).
std::shared_ptr<VerbsApi> RdmaCoreApi();

}  // namespace ferry::verbs
