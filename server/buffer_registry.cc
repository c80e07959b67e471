#include "server/buffer_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace ferry::server {

const std::string& Buffer::device() const {
  static const std::string kHost = "host";
  return kHost;
}

const fabric::MemoryRegion* Buffer::region(const std::string& provider) const {
  for (const auto& [name, region] : regions_) {
    if (name == provider) return region.get();
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<Buffer>> BufferRegistry::Allocate(uint64_t size,
                                                                 const std::string& name) {
  if (size == 0) return absl::InvalidArgumentError("size: must be positive");
  if (!name.empty()) {
    if (name.size() > 256 || name.find_first_of(": \t\n") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("name: '", name, "' must be at most 256 characters without ':' or spaces"));
    }
    absl::MutexLock lock(&mu_);
    if (by_name_.contains(name)) {
      return absl::AlreadyExistsError(absl::StrCat("name: a buffer named '", name, "' exists"));
    }
  }
  ASSIGN_OR_RETURN(auto block, pool_->Allocate(size));
  uint32_t access = name.empty() ? fabric::kLocal : (fabric::kRemoteWrite | fabric::kRemoteRead);
  Buffer::Regions regions;
  for (fabric::Fabric* f : fabrics_) {
    ASSIGN_OR_RETURN(auto region, f->Register(block->data(), size, access));
    regions.emplace_back(f->provider(), std::move(region));
  }
  absl::MutexLock lock(&mu_);
  if (!name.empty() && by_name_.contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("name: a buffer named '", name, "' exists"));
  }
  uint64_t id = next_id_++;
  auto buffer = std::make_shared<Buffer>(id, name, std::move(block), std::move(regions));
  by_id_.emplace(id, buffer);
  if (!name.empty()) by_name_.emplace(name, id);
  return buffer;
}

absl::Status BufferRegistry::Free(uint64_t id) {
  std::shared_ptr<Buffer> buffer;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
      return absl::NotFoundError(absl::StrCat("id: buffer ", id,
                                              id > 0 && id < next_id_ ? " was freed" : " does not exist"));
    }
    buffer = std::move(it->second);
    by_id_.erase(it);
    if (!buffer->name().empty()) by_name_.erase(buffer->name());
  }
  // `buffer` may still be held by transfers; the memory goes back when they finish.
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Buffer>> BufferRegistry::Get(uint64_t id,
                                                            const std::string& field) const {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) {
    return absl::NotFoundError(absl::StrCat(field, ": buffer ", id,
                                            id > 0 && id < next_id_ ? " was freed" : " does not exist"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<Buffer>> BufferRegistry::FindByName(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return absl::NotFoundError(absl::StrCat("no buffer named '", name, "'"));
  return by_id_.at(it->second);
}

std::vector<std::shared_ptr<Buffer>> BufferRegistry::List() const {
  std::vector<std::shared_ptr<Buffer>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, b] : by_id_) out.push_back(b);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return out;
}

size_t BufferRegistry::count() const {
  absl::MutexLock lock(&mu_);
  return by_id_.size();
}

}  // namespace ferry::server
