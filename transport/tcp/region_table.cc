#include "transport/tcp/region_table.h"

#include <random>

#include "base/byte_range.h"

namespace ferry::tcp {

uint32_t RegionTable::Add(const char* address, char* memory, uint64_t length, uint32_t access) {
  absl::MutexLock lock(&mu_);
  if (!seeded_) {
    // Random start so that keys from an agent's previous life are unlikely to be valid.
    next_key_ = std::random_device{}() | 1u;
    seeded_ = true;
  }
  uint32_t key;
  do {
    key = next_key_++;
  } while (key == 0 || entries_.contains(key));
  entries_.emplace(key, Entry{reinterpret_cast<uint64_t>(address), memory, length, access});
  return key;
}

void RegionTable::Remove(uint32_t key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  it->second.removing = true;
  mu_.Await(absl::Condition(
      +[](Entry* e) { return e->users == 0; }, &it->second));
  entries_.erase(key);
}

void RegionTable::SetAccess(uint32_t key, uint32_t access) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) it->second.access = access;
}

Refusal RegionTable::Acquire(uint32_t key, uint64_t address, uint64_t length, uint32_t access,
                             std::optional<Access>& out) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.removing) return Refusal::kBadKey;
  Entry& e = it->second;
  // Written so that no sum can overflow.
  if (address < e.address || !RangeFits(address - e.address, length, e.length)) {
    return Refusal::kOutOfBounds;
  }
  if ((e.access & access) != access) return Refusal::kAccess;
  ++e.users;
  out.emplace(this, key, e.memory + (address - e.address));
  return Refusal::kNone;
}

void RegionTable::Release(uint32_t key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) --it->second.users;
}

}  // namespace ferry::tcp
