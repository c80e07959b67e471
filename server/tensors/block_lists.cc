#include "server/tensors/block_lists.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/echo.h"
#include "base/status_macros.h"

namespace ferry::server {

std::pair<size_t, uint64_t> ExtentIndex::Find(uint64_t index) const {
  // The last extent whose first block is at or before `index`.
  size_t r = static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), index) -
                                 first_.begin()) - 1;
  return {r, index - first_[r]};
}

BlockList::BlockList(uint64_t id, uint64_t session, std::string name,
                     std::vector<ferry::v1::BlockExtent> extents)
    : id_(id), session_(session), name_(std::move(name)), extents_(std::move(extents)),
      index_(extents_) {}

ListBlock BlockList::At(uint64_t index) const {
  auto [r, j] = index_.Find(index);
  const ferry::v1::BlockExtent& e = extents_[r];
  return {e.buffer(), e.offset() + j * StrideOf(e), e.block_bytes()};
}

absl::StatusOr<std::shared_ptr<const BlockList>> BlockLists::Prepare(
    std::vector<ferry::v1::BlockExtent> extents, const std::string& name, uint64_t session) {
  if (extents.empty()) return absl::InvalidArgumentError("extents: the list is empty");
  if (name.size() > kMaxBufferName || name.find_first_of(" \t\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: ", Echo(name), " must be at most 256 characters without spaces"));
  }
  uint64_t total = 0;
  for (size_t r = 0; r < extents.size(); ++r) {
    const ferry::v1::BlockExtent& e = extents[r];
    const std::string at = absl::StrCat("extents[", r, "]");
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, buffers_->Get(e.buffer(), at + ".buffer"));
    if (e.block_bytes() == 0)
      return absl::InvalidArgumentError(at + ".block_bytes: must be positive");
    if (e.count() == 0) return absl::InvalidArgumentError(at + ".count: must be positive");
    // Blocks of one extent never overlap: a stride shorter than a block is no layout a KV
    // cache has (its head slices are strided by whole blocks), more likely two arguments
    // swapped; and a READ landing in such blocks would leave them holding a mix.
    if (e.stride() != 0 && e.stride() < e.block_bytes() && e.count() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".stride: ", e.stride(), " is less than block_bytes ", e.block_bytes(),
          " (blocks of one extent may not overlap; 0 means back to back)"));
    }
    const uint64_t size = buffer->size();
    if (!ExtentFits(e, size)) {
      return absl::OutOfRangeError(absl::StrCat(
          at, ".count: ", e.count(), " blocks of ", e.block_bytes(), " bytes ",
          StrideOf(e) == e.block_bytes() ? "" : absl::StrCat("every ", StrideOf(e), " bytes "),
          "from offset ", e.offset(), " do not fit in buffer ", e.buffer(), " (", size,
          " bytes)"));
    }
    total += e.count();
    if (total > kMaxListBlocks) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".count: the list would have more than ", kMaxListBlocks, " blocks"));
    }
    if (!name.empty() && buffer->name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".buffer: buffer ", e.buffer(), " has no name, and peers reach an exported "
          "list's blocks by their buffers' names (register or allocate it with a name)"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (!name.empty() && by_name_.contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("name: a list named '", name, "' exists"));
  }
  const uint64_t id = next_id_++;
  auto list = std::make_shared<const BlockList>(id, session, name, std::move(extents));
  by_id_.emplace(id, list);
  if (!name.empty()) by_name_.emplace(name, id);
  return list;
}

absl::Status BlockLists::Release(uint64_t id, uint64_t session) {
  std::vector<std::string> unexported;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
      return absl::NotFoundError(absl::StrCat("list: ", id, " does not exist"));
    }
    if (it->second->session() != session) {
      return absl::PermissionDeniedError(
          absl::StrCat("list: ", id, " belongs to session ", it->second->session()));
    }
    if (!it->second->name().empty()) {
      by_name_.erase(it->second->name());
      unexported.push_back(it->second->name());
    }
    by_id_.erase(it);
  }
  TellUnexported(unexported);
  return absl::OkStatus();
}

void BlockLists::TellUnexported(const std::vector<std::string>& names) {
  if (names.empty()) return;
  Unexported hook;
  {
    absl::MutexLock lock(&mu_);
    hook = on_unexport_;
  }
  if (hook) hook(names);
}

absl::StatusOr<std::shared_ptr<const BlockList>> BlockLists::Get(uint64_t id, uint64_t session,
                                                                 const std::string& field) const {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  // Another session's list is not this one's to move: it is as unknown as a missing one.
  if (it == by_id_.end() || it->second->session() != session) {
    return absl::NotFoundError(
        absl::StrCat(field, ": list ", id, " does not exist in this session"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<const BlockList>> BlockLists::Exported(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no block list named ", Echo(name)));
  }
  return by_id_.at(it->second);
}

size_t BlockLists::ReleaseOwnedBy(uint64_t session) {
  std::vector<std::string> unexported;
  size_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = by_id_.begin(); it != by_id_.end();) {
      if (it->second->session() != session) {
        ++it;
        continue;
      }
      if (!it->second->name().empty()) {
        by_name_.erase(it->second->name());
        unexported.push_back(it->second->name());
      }
      by_id_.erase(it++);
      ++n;
    }
  }
  TellUnexported(unexported);
  return n;
}

size_t BlockLists::count() const {
  absl::MutexLock lock(&mu_);
  return by_id_.size();
}

}  // namespace ferry::server
