#include "server/buffers/registration.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/buffers/gpu_pools.h"

namespace ferry::server {

std::string RegistrationAttempt::ToString() const {
  if (!status.ok()) return std::string(status.message());
  return absl::StrCat(rail.ToString(), ": ", method);
}

absl::StatusOr<BufferRegistrations> RegisterWithFabrics(const BufferMemory& memory,
                                                        const std::vector<fabric::Fabric*>& fabrics,
                                                        uint32_t access, GpuPools* gpus) {
  BufferRegistrations out;
  if (memory.shrinkable_range().second > 0) access |= fabric::kMayShrink;
  if (memory.gpu() < 0) {
    for (fabric::Fabric* f : fabrics) {
      ASSIGN_OR_RETURN(auto region, f->Register(memory.data(), memory.size(), access));
      out.regions.emplace_back(f->rail(), std::move(region));
    }
    return out;
  }
  if (gpus == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(memory.device(), ": GPU memory without the agent's GPU pools"));
  }
  for (fabric::Fabric* f : fabrics) {
    GdrRegistration r =
        gpus->RegisterForGdr(memory.gpu(), *f, memory.data(), memory.size(), access);
    if (r.region != nullptr) out.regions.emplace_back(f->rail(), std::move(r.region));
    out.attempts.push_back(std::move(r.attempt));
  }
  return out;
}

}  // namespace ferry::server
