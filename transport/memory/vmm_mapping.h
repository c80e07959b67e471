#pragma once
// How much of a client's VMM allocation the agent maps to register a range of it: the rule
// both GPU backends follow, so that the simulation refuses what the driver refuses.
//
// cuMemMap maps a handle from its start (offset 0, cuMemMap(3)) and whole: the driver
// refuses a size short of the allocation (CUDA_ERROR_NOT_SUPPORTED on an H200, driver 580)
// and one past its end. A shareable handle does not say its size, so the client gives it
// (GpuImport::allocation_size) or the range runs to the allocation's end.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "transport/memory/gpu_device.h"

namespace ferry::memory {

// The granularity the simulation allocates and maps VMM memory in: an H200's minimum
// (cuMemGetAllocationGranularity, CU_MEM_ALLOC_GRANULARITY_MINIMUM, for device memory).
inline constexpr uint64_t kSimVmmGranularity = 2ull << 20;

// The size to map for `what`: allocation_size, or offset + length rounded up to
// `granularity` when it is 0. OUT_OF_RANGE when the range overflows or runs past
// allocation_size; INVALID_ARGUMENT when allocation_size is no multiple of `granularity`
// (cuMemCreate makes none such).
absl::StatusOr<uint64_t> VmmMappingSize(const GpuImport& what, uint64_t granularity);

// What to tell a client whose mapping the driver refused.
std::string VmmMappingHint(const GpuImport& what);

}  // namespace ferry::memory
