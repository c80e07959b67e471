#pragma once
// A block list a peer exports, as its agent's ResolveBlocks answered: the extents (buffer
// name, offset, block size, count) that number its blocks. Checked before it is made (the
// extents size lookups), and kept while the peer says it will revoke it, for a while
// (server/peers/resolve_cache.h).

#include <string>

#include "absl/algorithm/container.h"
#include "absl/time/time.h"
#include "ferry/v1/tensor.pb.h"

namespace ferry::server {

struct RemoteList {
  std::string node;
  std::string name;
  ferry::v1::ResolveBlocksResponse answer;
  absl::Time asked_at;  // kept until kListAnswerTtl after (resolve_cache.h)

  // Whether one of its extents lies in the peer's buffer `buffer`.
  bool Names(const std::string& buffer) const {
    return absl::c_any_of(answer.extents(),
                          [&](const ferry::v1::RemoteExtent& e) { return e.buffer() == buffer; });
  }
};

}  // namespace ferry::server
