#pragma once
// Where a call's request is parsed: a protobuf arena for one request at a time, whose first
// block is kept from one request to the next.

#include <cstddef>
#include <memory>
#include <optional>

#include "google/protobuf/arena.h"

namespace ferry::server {

// A batch of 4096 ops parsed into a heap message is 4096 Op messages allocated one by one
// and deleted one by one when it goes (and the big frees run glibc's malloc_consolidate).
// In an arena it is a bump of a pointer each, and all of it goes at once. The arena keeps
// its first block across Reset, and that block grows to what the largest request took (up
// to kMaxKeptBlock): a steady run of batches then parses into memory already there. Pages
// of the block a request never reached are never touched, so a caller of one-op requests
// holds a few KiB, not the block's size. Not thread-safe: one request at a time.
class RequestArena {
 public:
  static constexpr size_t kFirstBlock = 16 << 10;
  static constexpr size_t kMaxKeptBlock = 4 << 20;

  RequestArena();
  RequestArena(const RequestArena&) = delete;
  RequestArena& operator=(const RequestArena&) = delete;

  google::protobuf::Arena* arena() { return &*arena_; }
  // Destroys every message made in the arena since the last Reset.
  void Reset();
  // The block kept across Reset (tests).
  size_t kept_block() const { return kept_size_; }

 private:
  void Make(size_t kept_size);

  size_t kept_size_ = 0;
  std::unique_ptr<char[]> kept_;
  // Declared after kept_: it goes first (the block must outlive it).
  std::optional<google::protobuf::Arena> arena_;
};

}  // namespace ferry::server
