#pragma once
// The exporter's side of kept ResolveBuffer answers (server/peers/resolve_cache.h is the
// asker's): which peers keep an answer for which of our buffer names, and calling them to
// drop it (Peer.Revoke) before it goes stale: a named buffer freed or unexported, the
// policy changed, the agent drains. A revocation returns once every holder answered or the
// timeout passed; only then does the caller let the buffer's memory and keys go, so a key
// a peer kept never reaches memory that was given to something else.
//
// The same for kept ResolveBlocks answers, by exported list name (GrantList, RevokeLists):
// a list released. A list's answer holds no key (its moves resolve each buffer as any
// transfer does), so its revocation guards against moving the wrong blocks, not memory.
//
// Not covered: a peer this agent no longer knows (removed from config, etcd or RemovePeer)
// cannot be called back; it keeps its answers until it restarts or we do.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/peers/peer_directory.h"

namespace ferry::server {

class ExportLeases {
 public:
  static constexpr absl::Duration kRevokeTimeout = absl::Seconds(2);

  // `peers` must outlive this; `self` names us in the Revoke calls.
  ExportLeases(std::string self, PeerDirectory* peers) : self_(std::move(self)), peers_(peers) {}

  // Whether an answer to `node` may be kept: only a peer we can call back.
  bool CanGrant(const std::string& node) const { return peers_->Known(node); }
  // Records that `node` keeps our answer for `name`. Call it after finding the buffer and
  // before reading what the answer says (policy, drain), then look the name up again: a
  // revocation that ran before the grant is then seen by the second lookup.
  void Grant(const std::string& name, const std::string& node);
  // Calls every holder of any of `names` to drop them (`reason` goes to their log).
  void Revoke(const std::vector<std::string>& names, const std::string& reason);
  // Calls every holder of anything to drop all of it.
  void RevokeAll(const std::string& reason);
  // How many of our names `node` keeps an answer for, and how many answers it was granted
  // in all (one per ResolveBuffer it made that could be kept).
  size_t HeldBy(const std::string& node) const;
  uint64_t GrantedTo(const std::string& node) const;

  // The same for exported list names: a ResolveBlocks answer grants the list's name here
  // and each of its buffers' names with Grant (a buffer freed takes the list's answer too).
  void GrantList(const std::string& list, const std::string& node);
  void RevokeLists(const std::vector<std::string>& lists, const std::string& reason);
  size_t ListsHeldBy(const std::string& node) const;
  uint64_t ListsGrantedTo(const std::string& node) const;

 private:
  // Who keeps answers for which names, of one kind (buffers or lists).
  struct Holders {
    std::map<std::string, std::set<std::string>> by_name;  // name -> nodes
    std::map<std::string, uint64_t> granted;               // node -> grants so far
  };
  // What one node is told to drop.
  struct Dropped {
    std::vector<std::string> names;
    std::vector<std::string> lists;
  };
  static void GrantIn(Holders& holders, const std::string& name, const std::string& node);
  // Takes the holders of `names` out of `holders`, into `by_node` (`field` picks the list).
  static void TakeHolders(Holders& holders, const std::vector<std::string>& names,
                          std::vector<std::string> Dropped::*field,
                          std::map<std::string, Dropped>& by_node);
  static size_t HeldIn(const Holders& holders, const std::string& node);
  static uint64_t GrantedIn(const Holders& holders, const std::string& node);
  // One Revoke per node, all at once; waits for them.
  void Call(const std::map<std::string, Dropped>& by_node, bool all, const std::string& reason);

  const std::string self_;
  PeerDirectory* const peers_;
  mutable absl::Mutex mu_;
  Holders buffers_ ABSL_GUARDED_BY(mu_);
  Holders lists_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
