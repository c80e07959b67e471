#include "transport/memory/range_allocator.h"

#include "absl/strings/str_cat.h"

namespace ferry::memory {

RangeAllocator::RangeAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity / alignment * alignment), alignment_(alignment) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

uint64_t RangeAllocator::RoundUp(uint64_t size) const {
  return (size + alignment_ - 1) / alignment_ * alignment_;
}

absl::StatusOr<uint64_t> RangeAllocator::Allocate(uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("size must be positive");
  if (size > capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(size, " bytes is more than the whole pool (", capacity_, " bytes)"));
  }
  uint64_t want = RoundUp(size);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    uint64_t offset = it->first, left = it->second - want;
    free_.erase(it);
    if (left > 0) free_.emplace(offset + want, left);
    taken_.emplace(offset, want);
    used_ += want;
    return offset;
  }
  return absl::ResourceExhaustedError(absl::StrCat("no free range of ", want, " bytes (",
                                                   capacity_ - used_, " free, largest ",
                                                   largest_free(), ")"));
}

absl::Status RangeAllocator::Free(uint64_t offset) {
  auto it = taken_.find(offset);
  if (it == taken_.end())
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " is not allocated"));
  uint64_t size = it->second;
  taken_.erase(it);
  used_ -= size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return absl::OkStatus();
    }
  }
  free_.emplace(offset, size);
  return absl::OkStatus();
}

uint64_t RangeAllocator::largest_free() const {
  uint64_t largest = 0;
  for (const auto& [offset, size] : free_) largest = std::max(largest, size);
  return largest;
}

double RangeAllocator::fragmentation() const {
  uint64_t free_total = capacity_ - used_;
  if (free_total == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free()) / static_cast<double>(free_total);
}

}  // namespace ferry::memory
