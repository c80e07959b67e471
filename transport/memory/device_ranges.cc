#include "transport/memory/device_ranges.h"

#include <iterator>

#include "absl/strings/str_format.h"
#include "base/byte_range.h"

namespace ferry::memory {

absl::Status DeviceRanges::Add(const void* device, uint64_t length, std::shared_ptr<char> bytes) {
  const uint64_t start = reinterpret_cast<uint64_t>(device);
  if (length == 0 || length > ~start || bytes == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("device ranges: cannot add %d bytes at %p", length, device));
  }
  absl::MutexLock lock(&mu_);
  auto next = ranges_.lower_bound(start);
  const bool overlaps_next = next != ranges_.end() && next->first - start < length;
  const bool overlaps_previous =
      next != ranges_.begin() && start - std::prev(next)->first < std::prev(next)->second.length;
  if (overlaps_next || overlaps_previous) {
    return absl::AlreadyExistsError(
        absl::StrFormat("device ranges: [%p, +%d) overlaps a range already added", device, length));
  }
  ranges_.emplace(start, Range{length, std::move(bytes)});
  return absl::OkStatus();
}

void DeviceRanges::Remove(const void* device) {
  absl::MutexLock lock(&mu_);
  ranges_.erase(reinterpret_cast<uint64_t>(device));
}

std::shared_ptr<char> DeviceRanges::Find(const void* address, uint64_t length) const {
  const uint64_t start = reinterpret_cast<uint64_t>(address);
  absl::MutexLock lock(&mu_);
  auto it = ranges_.upper_bound(start);
  if (it == ranges_.begin()) return nullptr;
  --it;
  const uint64_t offset = start - it->first;
  if (!RangeFits(offset, length, it->second.length)) return nullptr;
  // Aliasing: points at the byte asked for, owns the whole mapping.
  return std::shared_ptr<char>(it->second.bytes, it->second.bytes.get() + offset);
}

}  // namespace ferry::memory
