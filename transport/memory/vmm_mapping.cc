#include "transport/memory/vmm_mapping.h"

#include "absl/strings/str_cat.h"
#include "base/byte_size.h"

namespace ferry::memory {

absl::StatusOr<uint64_t> VmmMappingSize(const GpuImport& what, uint64_t granularity) {
  if (what.length > UINT64_MAX - what.offset) {
    return absl::OutOfRangeError("length: offset + length overflows");
  }
  const uint64_t end = what.offset + what.length;
  if (what.allocation_size != 0) {
    if (what.allocation_size % granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allocation_size: ", what.allocation_size, " is no multiple of the GPU's allocation "
          "granularity (", FormatByteSize(granularity), "), so no cuMemCreate size"));
    }
    if (end > what.allocation_size) {
      return absl::OutOfRangeError(absl::StrCat("length: [", what.offset, ", +", what.length,
                                                ") runs past allocation_size ",
                                                what.allocation_size));
    }
    return what.allocation_size;
  }
  if (end > UINT64_MAX - (granularity - 1)) {
    return absl::OutOfRangeError("length: offset + length overflows");
  }
  return (end + granularity - 1) / granularity * granularity;
}

std::string VmmMappingHint(const GpuImport& what) {
  if (what.allocation_size != 0) {
    return "a handle is mapped whole: is allocation_size the size cuMemCreate gave it?";
  }
  return absl::StrCat("a handle is mapped whole: [", what.offset, ", +", what.length,
                      ") must run to the allocation's end, or give allocation_size "
                      "(cuMemCreate's size)");
}

}  // namespace ferry::memory
