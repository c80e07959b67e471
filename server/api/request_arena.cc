#include "server/api/request_arena.h"

#include <algorithm>
#include <bit>

#include "base/batch_arena.h"

namespace ferry::server {

RequestArena::RequestArena() { Make(kFirstBlock); }

void RequestArena::Make(size_t kept_size) {
  arena_.reset();
  kept_size_ = kept_size;
  // Uninitialized: the arena touches only what it hands out.
  kept_.reset(new char[kept_size_]);
  // Past the kept block: geometric blocks up to 1 MiB, freed at Reset.
  arena_.emplace(BatchArenaOptions(kept_.get(), kept_size_));
}

void RequestArena::Reset() {
  // SpaceAllocated counts the kept block and every block the request added to it.
  const size_t took = arena_->SpaceAllocated();
  if (took > kept_size_ && kept_size_ < kMaxKeptBlock) {
    Make(std::min(std::bit_ceil(took), kMaxKeptBlock));  // the new arena starts empty
    return;
  }
  arena_->Reset();
}

}  // namespace ferry::server
