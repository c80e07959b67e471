#pragma once
// Prepared block lists (PrepareBlocks): an ordered list of blocks over buffers, e.g. every
// layer's K and V cache cut into blocks, numbered extent by extent so that one MoveBlocks
// call names any set of them by index. A named list is exported: peers resolve its blocks
// by that name (TensorPeer.ResolveBlocks). A list holds buffer ids, not the buffers: it
// keeps no memory alive, and a block of a buffer since freed fails the op that names it.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ferry/v1/tensor.pb.h"
#include "server/buffers/buffer_registry.h"

namespace ferry::server {

// One block of a list: where its bytes are.
struct ListBlock {
  uint64_t buffer = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The distance from one block of extent `e` (BlockExtent or RemoteExtent) to the next.
template <typename Extent>
uint64_t StrideOf(const Extent& e) {
  return e.stride() == 0 ? e.block_bytes() : e.stride();
}

// Whether every block of extent `e` (block_bytes > 0, count > 0) lies in [0, size): its last
// one, at offset + (count - 1) * stride, ends by `size`; overflow-safe for any input (a
// peer's answer is one).
template <typename Extent>
bool ExtentFits(const Extent& e, uint64_t size) {
  if (e.offset() > size || e.block_bytes() > size - e.offset()) return false;
  const uint64_t room = size - e.offset() - e.block_bytes();  // for the blocks after the first
  return e.count() - 1 <= room / StrideOf(e);
}

// Numbers blocks extent by extent (anything with count()): block j of extent r is index
// (blocks of the extents before r) + j.
class ExtentIndex {
 public:
  template <typename Extents>
  explicit ExtentIndex(const Extents& extents) {
    first_.reserve(extents.size());
    for (const auto& e : extents) {
      first_.push_back(size_);
      size_ += e.count();
    }
  }
  uint64_t size() const { return size_; }
  // (extent, block within it) of `index` (< size()).
  std::pair<size_t, uint64_t> Find(uint64_t index) const;

 private:
  std::vector<uint64_t> first_;  // the index of each extent's first block
  uint64_t size_ = 0;
};

class BlockList {
 public:
  BlockList(uint64_t id, uint64_t session, std::string name,
            std::vector<ferry::v1::BlockExtent> extents);

  uint64_t id() const { return id_; }
  uint64_t session() const { return session_; }
  const std::string& name() const { return name_; }
  uint64_t size() const { return index_.size(); }  // blocks
  const std::vector<ferry::v1::BlockExtent>& extents() const { return extents_; }
  // Block `index` (< size()).
  ListBlock At(uint64_t index) const;

 private:
  const uint64_t id_;
  const uint64_t session_;
  const std::string name_;
  const std::vector<ferry::v1::BlockExtent> extents_;
  const ExtentIndex index_;
};

// The most blocks one list holds (indices stay well inside 64 bits, as a peer checks too).
inline constexpr uint64_t kMaxListBlocks = 1ull << 32;

class BlockLists {
 public:
  explicit BlockLists(BufferRegistry* buffers) : buffers_(buffers) {}

  // A list for `session` over `extents`, each checked now: a live buffer (NOT_FOUND naming
  // "extents[r].buffer"), the extent's blocks inside it (OUT_OF_RANGE naming
  // "extents[r].count"), no empty extent, a stride of at least block_bytes when count > 1
  // (INVALID_ARGUMENT naming "extents[r].stride": one extent's blocks never overlap; blocks
  // of different extents may), at most kMaxListBlocks in all (INVALID_ARGUMENT
  // naming the field); a named list's buffers must be named, as peers reach them by name;
  // ALREADY_EXISTS for a name another list exports.
  absl::StatusOr<std::shared_ptr<const BlockList>> Prepare(
      std::vector<ferry::v1::BlockExtent> extents, const std::string& name, uint64_t session);
  // NOT_FOUND for an unknown id, PERMISSION_DENIED for another session's list.
  absl::Status Release(uint64_t id, uint64_t session);
  // The session's list `id`; NOT_FOUND naming `field` else.
  absl::StatusOr<std::shared_ptr<const BlockList>> Get(uint64_t id, uint64_t session,
                                                       const std::string& field) const;
  // The list exported as `name`; NOT_FOUND else.
  absl::StatusOr<std::shared_ptr<const BlockList>> Exported(const std::string& name) const;
  // The session ended: its lists go.
  size_t ReleaseOwnedBy(uint64_t session);
  size_t count() const;
  // Called with the names of exported lists that went (Release, ReleaseOwnedBy), after
  // they went and before those calls return, so that peers keeping their answers are told
  // first (ExportLeases::RevokeLists). Set once, before lists are made.
  using Unexported = std::function<void(const std::vector<std::string>& names)>;
  void OnUnexport(Unexported hook) {
    absl::MutexLock lock(&mu_);
    on_unexport_ = std::move(hook);
  }

 private:
  // Runs on_unexport_ (copied under the lock) for `names`, if any.
  void TellUnexported(const std::vector<std::string>& names) ABSL_LOCKS_EXCLUDED(mu_);

  BufferRegistry* const buffers_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<const BlockList>> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> by_name_ ABSL_GUARDED_BY(mu_);
  Unexported on_unexport_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
