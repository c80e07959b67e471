#pragma once
// The arena a message of many ops is built or parsed in (a client's batch, the agent's
// requests, a block move's ops): a batch of thousands of ops is then a few blocks to
// allocate and free, not a message per op, each deleted one by one when it goes.

#include <cstddef>

#include "google/protobuf/arena.h"

namespace ferry {

// Blocks from 16 KiB (one op fits the first) growing to 1 MiB. `initial_block`, when given,
// is used first and kept by its owner (protobuf never frees it).
inline google::protobuf::ArenaOptions BatchArenaOptions(char* initial_block = nullptr,
                                                        size_t initial_block_size = 0) {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 16 << 10;
  options.max_block_size = 1 << 20;
  options.initial_block = initial_block;
  options.initial_block_size = initial_block_size;
  return options;
}

}  // namespace ferry
