#include "transport/memory/peer_memory.h"

namespace ferry::memory {

DeviceRanges& PeerMemory() {
  // Never destroyed: a slab or a registration may outlive main()'s statics.
  static DeviceRanges* table = new DeviceRanges();
  return *table;
}

}  // namespace ferry::memory
