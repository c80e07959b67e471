#pragma once
// Target QP numbers of our closed endpoints, per peer address, waiting for the next
// handshake with that peer to tell it which of its QPs it may free.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace ferry::verbs {

class RetiredQps {
 public:
  // A peer is told about this many at most; older ones are its to reap on teardown.
  static constexpr size_t kMaxPerPeer = 1024;

  void Add(const std::string& peer_address, uint32_t target_qpn) {
    absl::MutexLock lock(&mu_);
    auto& list = retired_[peer_address];
    if (list.size() < kMaxPerPeer) list.push_back(target_qpn);
  }

  std::vector<uint32_t> Take(const std::string& peer_address) {
    absl::MutexLock lock(&mu_);
    auto it = retired_.find(peer_address);
    if (it == retired_.end()) return {};
    std::vector<uint32_t> out = std::move(it->second);
    retired_.erase(it);
    return out;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<uint32_t>> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::verbs
