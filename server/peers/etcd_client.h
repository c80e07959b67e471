#pragma once
// etcd's v3 API, as much of it as discovery needs (leases, put, range and watch of a prefix),
// through etcd's own JSON gateway: HTTP/1.1 POSTs to /v3/... on the client port (etcd 3.4
// serves /v3/ and the older /v3beta/ alike; 3.3 only /v3beta/), keys and values base64,
// 64-bit numbers as strings. Why not the gRPC API: its .proto files (Debian's
// golang-etcd-server-dev) import gogoproto and google/api annotations, which pull in the Go
// toolchain's packages to build three generated libraries; the gateway is part of every
// etcd binary and needs only our small HTTP client.
//
// Calls block the caller's thread up to the client's timeout. With several endpoints a call
// that cannot reach one tries the next, and the next call starts at the one that answered.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ferry::server {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;  // for kDelete only the key and revision
};

struct EtcdRange {
  int64_t revision = 0;  // the store's revision the answer is of: watch from revision + 1
  std::vector<EtcdKeyValue> kvs;
};

class EtcdClient {
 public:
  // `endpoints`: "host:port" of etcd's client URLs.
  explicit EtcdClient(std::vector<std::string> endpoints,
                      absl::Duration timeout = absl::Seconds(3));

  // A new lease of `ttl` (whole seconds); its id.
  absl::StatusOr<int64_t> Grant(absl::Duration ttl);
  // One keepalive of `lease`: the TTL it has again, in seconds; 0 when etcd no longer knows
  // it (it expired, or etcd lost it): the keys on it are gone.
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  // Ends `lease` now; its keys are deleted. OK for a lease etcd no longer knows.
  absl::Status Revoke(int64_t lease);
  // `key` = `value`, attached to `lease` (0: none).
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease);
  // Deletes `key` (OK when there is none).
  absl::Status Delete(const std::string& key);
  // Every key that starts with `prefix`.
  absl::StatusOr<EtcdRange> RangePrefix(const std::string& prefix);
  // Streams the changes under `prefix` from `start_revision` to `on_event` (on this thread)
  // until `stopped()` (then OK; looked at every 100 ms), or the watch ends: etcd cancelled it
  // (ABORTED, e.g. the revision was compacted: read the range again) or the connection broke
  // (UNAVAILABLE). Tries one endpoint, then the next on the next call.
  absl::Status WatchPrefix(const std::string& prefix, int64_t start_revision,
                           const std::function<void(const EtcdEvent&)>& on_event,
                           const std::function<bool()>& stopped);

  // The end of the key range of `prefix` (etcd's range_end: `prefix` with its last byte
  // incremented; "\0" for all keys when every byte is 0xff).
  static std::string PrefixEnd(const std::string& prefix);

 private:
  // POSTs to each endpoint in turn from the last good one; the JSON answer of the first that
  // answers. An answer with an "error" (etcd refused) is that error, not a reason to move on.
  absl::StatusOr<std::string> Call(const std::string& path, const std::string& body);

  const std::vector<std::string> endpoints_;
  const absl::Duration timeout_;
  std::atomic<size_t> current_{0};
};

}  // namespace ferry::server
