#include "transport/tcp/region_table.h"

#include "base/byte_range.h"
#include "base/random_bytes.h"
#include "transport/fabric.h"

namespace ferry::tcp {

absl::StatusOr<uint32_t> RegionTable::Add(const char* address, char* memory, uint64_t length,
                                          uint32_t access) {
  absl::MutexLock lock(&mu_);
  uint32_t key = 0;
  // A collision is rare (the table holds thousands of 2^32 keys): draw again.
  while (key == 0 || entries_.contains(key)) {
    auto drawn = RandomValue<uint32_t>();
    if (!drawn.ok()) return drawn.status();
    key = *drawn;
  }
  entries_.emplace(key, Entry{reinterpret_cast<uint64_t>(address), memory, length, access, {}});
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

void RegionTable::SetAllowedPeers(uint32_t key, const std::vector<std::string>& nodes) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) it->second.allowed_peers = {nodes.begin(), nodes.end()};
}

RegionCheck RegionTable::Acquire(uint32_t key, uint64_t address, uint64_t length,
                                 uint32_t access, const std::string& peer,
                                 std::optional<Access>& out) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.removing) return RegionCheck::kUnknownKey;
  Entry& e = it->second;
  // Before bounds and access: a peer the region is not exported to learns nothing of it.
  if (!e.allowed_peers.empty() && !e.allowed_peers.contains(peer)) return RegionCheck::kPeer;
  // Written so that no sum can overflow.
  if (address < e.address || !RangeFits(address - e.address, length, e.length)) {
    return RegionCheck::kOutOfBounds;
  }
  if ((e.access & access) != access) return RegionCheck::kAccess;
  if (e.faulted) return RegionCheck::kFaulted;
  ++e.users;
  out.emplace(this, key, e.memory + (address - e.address), (e.access & fabric::kMayShrink) != 0);
  return RegionCheck::kOk;
}

void RegionTable::MarkFaulted(uint32_t key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) it->second.faulted = true;
}

void RegionTable::Release(uint32_t key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) --it->second.users;
}

}  // namespace ferry::tcp
