#include "server/buffers/buffer_registry.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "server/buffers/gpu_pools.h"
#include "server/buffers/host_memory.h"
#include "server/buffers/open_files.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

absl::StatusOr<int> GpuIndexOf(const std::string& device) {
  if (device.empty() || device == "host") return -1;
  int index = -1;
  if (device.rfind("cuda:", 0) != 0 || !absl::SimpleAtoi(device.substr(5), &index) || index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", device, "' is not \"host\" or \"cuda:N\""));
  }
  return index;
}

uint64_t Buffer::owner() const {
  absl::MutexLock lock(&owner_mu_);
  return owner_.session;
}

std::string Buffer::owner_label() const {
  absl::MutexLock lock(&owner_mu_);
  return owner_.label;
}

int64_t Buffer::owner_uid() const {
  absl::MutexLock lock(&owner_mu_);
  return owner_.uid;
}

const fabric::MemoryRegion* Buffer::region(const fabric::RailId& rail) const {
  for (const auto& [id, region] : regions_) {
    if (id == rail) return region.get();
  }
  return nullptr;
}

bool Buffer::ExportedTo(const std::string& node) const {
  if (name_.empty()) return false;
  return allowed_peers_.empty() ||
         std::find(allowed_peers_.begin(), allowed_peers_.end(), node) != allowed_peers_.end();
}

absl::Status BufferRegistry::CheckExport(const std::string& name,
                                         const std::vector<std::string>& allowed_peers) const {
  if (!allowed_peers.empty() && name.empty()) {
    return absl::InvalidArgumentError(
        "allowed_peers: only a named buffer is exported to peers; name it, or list no peers");
  }
  for (size_t i = 0; i < allowed_peers.size(); ++i) {
    if (allowed_peers[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("allowed_peers[", i, "]: empty node name"));
    }
  }
  if (name.empty()) return absl::OkStatus();
  if (name.size() > kMaxBufferName || name.find_first_of(": \t\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: ", Echo(name), " must be at most 256 characters without ':' or spaces"));
  }
  absl::MutexLock lock(&mu_);
  if (by_name_.contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("name: a buffer named '", name, "' exists"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Buffer>> BufferRegistry::Allocate(
    uint64_t size, const std::string& name, const std::string& device, BufferOwner owner,
    std::vector<std::string> allowed_peers) {
  if (size == 0) return absl::InvalidArgumentError("size: must be positive");
  RETURN_IF_ERROR(CheckExport(name, allowed_peers));
  std::unique_ptr<BufferMemory> memory;
  if (device.empty() || device == "host") {
    // Each host buffer holds its own file (host_pool.h): the same descriptor room as
    // registrations, so that no number of buffers leaves the agent unable to accept.
    RETURN_IF_ERROR(RoomForClientFd(ClientFdHold::held(), "size"));
    ASSIGN_OR_RETURN(auto block, pool_->Allocate(size));
    memory = std::make_unique<HostMemory>(std::move(block));
  } else {
    ASSIGN_OR_RETURN(int gpu, GpuIndexOf(device));
    if (gpus_ == nullptr || static_cast<size_t>(gpu) >= gpus_->count()) {
      return absl::NotFoundError(absl::StrCat("device: this agent has no GPU ", device, " (it has ",
                                              gpus_ ? gpus_->count() : 0, ")"));
    }
    ASSIGN_OR_RETURN(memory, gpus_->Allocate(gpu, size));
  }
  uint32_t access = name.empty() ? fabric::kLocal : (fabric::kRemoteWrite | fabric::kRemoteRead);
  return Insert(std::move(memory), access, name, std::move(owner), std::move(allowed_peers));
}

absl::StatusOr<std::shared_ptr<Buffer>> BufferRegistry::AddClientMemory(
    std::unique_ptr<BufferMemory> memory, const std::string& name, BufferOwner owner,
    std::vector<std::string> allowed_peers) {
  RETURN_IF_ERROR(CheckExport(name, allowed_peers));
  return Insert(std::move(memory), fabric::kRemoteWrite | fabric::kRemoteRead, name,
                std::move(owner), std::move(allowed_peers));
}

absl::StatusOr<std::shared_ptr<Buffer>> BufferRegistry::Insert(
    std::unique_ptr<BufferMemory> memory, uint32_t access, const std::string& name,
    BufferOwner owner, std::vector<std::string> allowed_peers) {
  // A fabric that cannot register GPU memory leaves the buffer to staging; the attempt stays
  // with the buffer and its reason shows in every transfer that stages it.
  ASSIGN_OR_RETURN(BufferRegistrations registrations,
                   RegisterWithFabrics(*memory, fabrics_for_(*memory), access, gpus_));
  if (!allowed_peers.empty()) {
    for (const auto& [rail, region] : registrations.regions) {
      absl::Status scoped = region->RestrictToPeers(allowed_peers);
      // verbs: the rkey reaches whoever has it; ResolveBuffer gives it only to those listed.
      if (!scoped.ok() && !absl::IsUnimplemented(scoped)) return scoped;
    }
  }
  absl::MutexLock lock(&mu_);
  if (!name.empty() && by_name_.contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("name: a buffer named '", name, "' exists"));
  }
  uint64_t id = next_id_++;
  auto buffer = std::make_shared<Buffer>(id, name, std::move(memory), std::move(registrations),
                                         std::move(owner), std::move(allowed_peers));
  buffer->fd_socket_ = fd_socket_;
  by_id_.emplace(id, buffer);
  if (!name.empty()) by_name_.emplace(name, id);
  return buffer;
}

absl::Status BufferRegistry::Free(uint64_t id) { return FreeFor(id, kAnySession); }

absl::Status BufferRegistry::FreeFor(uint64_t id, uint64_t session) {
  std::shared_ptr<Buffer> buffer;
  std::vector<std::string> names;
  {
    // The owner check and the removal under one lock: no Adopt or second Free in between.
    absl::MutexLock lock(&mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return Unknown("id", id);
    uint64_t owner = it->second->owner();
    if (session != kAnySession && owner != 0 && owner != session) {
      return absl::PermissionDeniedError(absl::StrCat(
          "id: buffer ", id, " belongs to ", it->second->owner_label(),
          "; only its owner frees it (or it is freed when that session ends)"));
    }
    buffer = std::move(it->second);
    by_id_.erase(it);
    if (ForgetName(*buffer)) names.push_back(buffer->name());
  }
  TellUnexported(names);
  // `buffer` may still be held by transfers; the memory goes back when they finish.
  return absl::OkStatus();
}

size_t BufferRegistry::FreeOwnedBy(uint64_t session) {
  if (session == 0) return 0;
  std::vector<std::shared_ptr<Buffer>> freed;
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = by_id_.begin(); it != by_id_.end();) {
      if (it->second->owner() != session) {
        ++it;
        continue;
      }
      if (ForgetName(*it->second)) names.push_back(it->second->name());
      freed.push_back(std::move(it->second));
      by_id_.erase(it++);
    }
  }
  TellUnexported(names);
  // Dropped here, outside the lock: revoking keys may wait for remote accesses.
  return freed.size();
}

absl::Status BufferRegistry::Unknown(const std::string& field, uint64_t id) const {
  const bool handed_out = id >= first_id_ && id < next_id_;
  return absl::NotFoundError(
      absl::StrCat(field, ": buffer ", id, handed_out ? " was freed" : " does not exist"));
}

bool BufferRegistry::ForgetName(const Buffer& buffer) {
  // Only while the name is still this buffer's: after Unexport another buffer may hold it.
  auto it = by_name_.find(buffer.name());
  if (it == by_name_.end() || it->second != buffer.id()) return false;
  by_name_.erase(it);
  return true;
}

void BufferRegistry::TellUnexported(const std::vector<std::string>& names) {
  if (names.empty()) return;
  Unexported hook;
  {
    absl::MutexLock lock(&mu_);
    hook = on_unexport_;
  }
  if (hook) hook(names);
}

absl::Status BufferRegistry::Adopt(uint64_t id, BufferOwner owner) {
  ASSIGN_OR_RETURN(auto buffer, Get(id, "id"));
  absl::MutexLock lock(&buffer->owner_mu_);
  buffer->owner_ = std::move(owner);
  return absl::OkStatus();
}

absl::Status BufferRegistry::Unexport(uint64_t id) {
  std::shared_ptr<Buffer> buffer;
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return Unknown("id", id);
    buffer = it->second;
    if (ForgetName(*buffer)) names.push_back(buffer->name());
  }
  TellUnexported(names);
  for (const auto& [rail, region] : buffer->regions()) {
    absl::Status s = region->RestrictToLocal();
    if (!s.ok()) {
      spdlog::debug("buffer {}: remote access stays with {}: {}", id, rail.ToString(),
                    s.ToString());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Buffer>> BufferRegistry::Get(uint64_t id,
                                                            const std::string& field) const {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return Unknown(field, id);
  return it->second;
}

absl::StatusOr<std::shared_ptr<Buffer>> BufferRegistry::FindByName(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    return absl::NotFoundError(absl::StrCat("no buffer named ", Echo(name)));
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

uint64_t BufferRegistry::host_bytes() const {
  constexpr uint64_t kAlign = memory::HostPool::kAlignment;
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [id, b] : by_id_) {
    if (b->gpu() < 0 && !b->memory().registered()) {
      total += (b->size() + kAlign - 1) / kAlign * kAlign;
    }
  }
  return total;
}

uint64_t BufferRegistry::registered_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [id, b] : by_id_) {
    if (b->memory().registered()) total += b->size();
  }
  return total;
}

}  // namespace ferry::server
