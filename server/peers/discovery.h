#pragma once
// Discovery on etcd. The agent registers itself under prefix + node, as a JSON record (node,
// peer address, providers, incarnation), on a lease it keeps alive every TTL/3; and it
// watches the prefix: every other agent's record is a peer of the PeerDirectory
// (PeerSource::kEtcd) until its key goes (the agent deregistered, or its lease lapsed: it
// died or lost etcd for a TTL). Peers the config file or an operator named stay whatever
// etcd says.
//
// etcd need not be up when the agent starts, nor stay up: the agent keeps the peers it
// knows and tries again every second. A lease etcd no longer knows (etcd lost it, or the
// agent stalled past the TTL) is granted again and the record put back; a watch that ends
// reads the prefix again, so no change is missed.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/peers/etcd_client.h"
#include "server/peers/peer_directory.h"

namespace ferry::server {

// What an agent puts in etcd about itself.
struct NodeRecord {
  std::string node;
  std::string address;  // its Peer API, host:port
  std::vector<std::string> providers;
  uint64_t incarnation = 0;
};

// {"node":"node-a","address":"10.0.0.1:7100","providers":["verbs","tcp"],
//  "incarnation":"8f3a..."} (the incarnation in hex: a JSON number would round it).
std::string EncodeNodeRecord(const NodeRecord& record);
// INVALID_ARGUMENT naming the field that is missing or malformed.
absl::StatusOr<NodeRecord> DecodeNodeRecord(const std::string& json);

struct DiscoveryOptions {
  std::vector<std::string> endpoints;  // etcd client endpoints, host:port
  std::string prefix;                  // ends with '/'
  absl::Duration lease_ttl = absl::Seconds(10);
  NodeRecord self;
};

class EtcdDiscovery {
 public:
  // Starts registering and watching, each on a thread of its own; returns at once.
  // `peers` must outlive this.
  static std::unique_ptr<EtcdDiscovery> Start(DiscoveryOptions options, PeerDirectory* peers);
  // Deregisters.
  ~EtcdDiscovery();
  EtcdDiscovery(const EtcdDiscovery&) = delete;
  EtcdDiscovery& operator=(const EtcdDiscovery&) = delete;

  // Stops watching and keeping the lease, then revokes it: etcd deletes the record, and every
  // peer drops this node now instead of after the TTL (SIGTERM, drain). Peers found in etcd
  // stay in the directory. Idempotent. Blocks while a call in flight ends and the revoke is
  // sent: with etcd unreachable, up to the client timeout (3 s) per endpoint, twice.
  void Deregister();

  // The key this agent registers under.
  std::string key() const { return options_.prefix + options_.self.node; }

 private:
  EtcdDiscovery(DiscoveryOptions options, PeerDirectory* peers);

  // Grants the lease and puts the record; then keeps the lease alive, and registers again
  // when it is lost.
  void RegisterLoop();
  // Reads the prefix, then watches it from there; again after the watch ends.
  void WatchLoop();
  // Makes the directory's etcd peers those of `range` (after a read of the prefix).
  void Sync(const EtcdRange& range);
  void Apply(const EtcdEvent& event);
  // The peer a record under the prefix names, or nullopt (with a warning) for a record that
  // is not one, or this agent's own.
  std::optional<NodeRecord> PeerOf(const EtcdKeyValue& kv);
  // Sleeps `d`, or less when stopping or a reclaim is asked; false when stopping.
  bool Pause(absl::Duration d);
  // The watch saw this agent's own key deleted or holding another record (`why`): the
  // register thread puts it back at once (an agent must not vanish from discovery until it
  // restarts because an operator or a rogue client removed its key).
  void AskReclaim(const std::string& why);
  // The register thread: why a reclaim was asked, taken ("" for none).
  std::string TakeReclaim();
  // Whether `kv` holds this agent's own record, as it registered it.
  bool IsOurs(const EtcdKeyValue& kv) const;
  bool stopping() const { return stopping_.load(); }
  // Warns about `what` once until `ok` says it works again (not every second while etcd is
  // down); then says so.
  void Report(std::atomic<bool>& failing, const std::string& what, const absl::Status& status);

  const DiscoveryOptions options_;
  const std::string record_;
  PeerDirectory* const peers_;
  EtcdClient etcd_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> register_failing_{false};
  std::atomic<bool> watch_failing_{false};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;  // wakes Pause
  std::string reclaim_ ABSL_GUARDED_BY(mu_);   // wakes Pause too: why the key must go back
  // The lease the record is on (0: none); the register thread's until it is joined.
  int64_t lease_ = 0;
  // The nodes this agent took from etcd (only the watch thread reads or writes it).
  std::set<std::string> known_;
  std::thread register_thread_;
  std::thread watch_thread_;
  std::once_flag deregistered_;
};

}  // namespace ferry::server
