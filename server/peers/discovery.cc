#include "server/peers/discovery.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/echo.h"
#include "base/json_writer.h"
#include "config/config.h"
#include "server/peers/json_fields.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

// How soon etcd is tried again after a failed call.
constexpr absl::Duration kRetry = absl::Seconds(1);

}  // namespace

std::string EncodeNodeRecord(const NodeRecord& record) {
  JsonWriter w;
  w.BeginObject().Key("node").String(record.node).Key("address").String(record.address);
  w.Key("providers").BeginArray();
  for (const auto& p : record.providers) w.String(p);
  w.EndArray();
  w.Key("incarnation").String(absl::StrCat(absl::Hex(record.incarnation)));
  w.EndObject();
  return w.str();
}

absl::StatusOr<NodeRecord> DecodeNodeRecord(const std::string& text) {
  auto parsed = json::ParseObject(text, "node record");
  if (!parsed.ok()) return absl::InvalidArgumentError(parsed.status().message());
  NodeRecord out;
  out.node = json::Text(*parsed, "node");
  if (absl::Status valid = config::ValidateNodeName(out.node); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("node: ", valid.message()));
  }
  out.address = json::Text(*parsed, "address");
  if (absl::Status valid = config::ValidateAddress(out.address, false); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("address: ", valid.message()));
  }
  if (const json::Value* providers = json::Field(*parsed, "providers");
      providers != nullptr && providers->has_list_value()) {
    for (const auto& p : providers->list_value().values()) {
      if (p.kind_case() == json::Value::kStringValue) out.providers.push_back(p.string_value());
    }
  }
  const std::string incarnation = json::Text(*parsed, "incarnation");
  auto [end, ec] = std::from_chars(incarnation.data(), incarnation.data() + incarnation.size(),
                                   out.incarnation, 16);
  if (ec != std::errc() || end != incarnation.data() + incarnation.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("incarnation: ", Echo(incarnation), " is not a hex number"));
  }
  return out;
}

EtcdDiscovery::EtcdDiscovery(DiscoveryOptions options, PeerDirectory* peers)
    : options_(std::move(options)),
      record_(EncodeNodeRecord(options_.self)),
      peers_(peers),
      etcd_(options_.endpoints) {}

std::unique_ptr<EtcdDiscovery> EtcdDiscovery::Start(DiscoveryOptions options,
                                                    PeerDirectory* peers) {
  std::unique_ptr<EtcdDiscovery> d(new EtcdDiscovery(std::move(options), peers));
  spdlog::info("etcd: registering as {} at {} (lease {}), watching {} on {}", d->key(),
               d->options_.self.address, absl::FormatDuration(d->options_.lease_ttl),
               d->options_.prefix, absl::StrJoin(d->options_.endpoints, ","));
  d->register_thread_ = std::thread([raw = d.get()] { raw->RegisterLoop(); });
  d->watch_thread_ = std::thread([raw = d.get()] { raw->WatchLoop(); });
  return d;
}

EtcdDiscovery::~EtcdDiscovery() { Deregister(); }

void EtcdDiscovery::Deregister() {
  std::call_once(deregistered_, [this] {
    stopping_ = true;
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (register_thread_.joinable()) register_thread_.join();
    if (watch_thread_.joinable()) watch_thread_.join();
    if (lease_ == 0) {
      spdlog::info("etcd: {} was not registered, nothing to revoke", key());
      return;
    }
    absl::Status revoked = etcd_.Revoke(lease_);
    if (revoked.ok()) {
      spdlog::info("etcd: deregistered {} (lease {:x} revoked)", key(), lease_);
    } else {
      spdlog::warn("etcd: could not revoke lease {:x}, {} goes when it lapses: {}", lease_,
                   key(), std::string(revoked.message()));
    }
    lease_ = 0;
  });
}

bool EtcdDiscovery::Pause(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !reclaim_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&woken), d);
  return !stop_;
}

void EtcdDiscovery::AskReclaim(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (reclaim_.empty()) reclaim_ = why;
}

std::string EtcdDiscovery::TakeReclaim() {
  absl::MutexLock lock(&mu_);
  return std::exchange(reclaim_, std::string());
}

bool EtcdDiscovery::IsOurs(const EtcdKeyValue& kv) const {
  absl::StatusOr<NodeRecord> record = DecodeNodeRecord(kv.value);
  return record.ok() && record->node == options_.self.node &&
         record->incarnation == options_.self.incarnation &&
         record->address == options_.self.address;
}

void EtcdDiscovery::Report(std::atomic<bool>& failing, const std::string& what,
                           const absl::Status& status) {
  if (status.ok()) {
    if (failing.exchange(false)) spdlog::info("etcd: {} works again", what);
    return;
  }
  if (!failing.exchange(true)) {
    spdlog::warn("etcd: {} failed, trying again every {}: {}", what, absl::FormatDuration(kRetry),
                 std::string(status.message()));
  }
}

void EtcdDiscovery::RegisterLoop() {
  const absl::Duration keepalive_every = options_.lease_ttl / 3;
  while (!stopping()) {
    if (lease_ == 0) {
      absl::StatusOr<int64_t> lease = etcd_.Grant(options_.lease_ttl);
      absl::Status put = lease.ok() ? etcd_.Put(key(), record_, *lease) : lease.status();
      Report(register_failing_, "registration", put);
      if (!put.ok()) {
        if (lease.ok()) etcd_.Revoke(*lease).IgnoreError();
        Pause(kRetry);
        continue;
      }
      lease_ = *lease;
      spdlog::info("etcd: registered {} on lease {:x}", key(), lease_);
    }
    if (!Pause(keepalive_every)) break;
    if (std::string why = TakeReclaim(); !why.empty()) {
      absl::Status put = etcd_.Put(key(), record_, lease_);
      if (put.ok()) {
        spdlog::warn("etcd: {} {}; put it back on lease {:x}", key(), why, lease_);
      } else {
        // The lease may be gone too (it lapsed): registering anew, on a new lease.
        spdlog::warn("etcd: {} {}; putting it back on lease {:x} failed, registering anew: {}",
                     key(), why, lease_, std::string(put.message()));
        lease_ = 0;
      }
      continue;
    }
    absl::StatusOr<int64_t> ttl = etcd_.KeepAlive(lease_);
    Report(register_failing_, "lease keepalive", ttl.status());
    if (!ttl.ok()) {
      // The lease may still live: keep it, and try again soon (keepalives at TTL/3 leave two
      // more tries before it lapses).
      Pause(std::min(kRetry, keepalive_every));
      continue;
    }
    if (*ttl == 0) {
      spdlog::warn("etcd: lease {:x} of {} is gone (etcd lost it, or it lapsed); registering again",
                   lease_, key());
      lease_ = 0;
    }
  }
}

void EtcdDiscovery::WatchLoop() {
  while (!stopping()) {
    absl::StatusOr<EtcdRange> range = etcd_.RangePrefix(options_.prefix);
    Report(watch_failing_, absl::StrCat("reading ", options_.prefix), range.status());
    if (!range.ok()) {
      Pause(kRetry);
      continue;
    }
    Sync(*range);
    const absl::Time started = absl::Now();
    absl::Status ended = etcd_.WatchPrefix(
        options_.prefix, range->revision + 1, [this](const EtcdEvent& e) { Apply(e); },
        [this] { return stopping(); });
    if (stopping()) break;
    spdlog::info("etcd: the watch of {} ended ({}); reading it again", options_.prefix,
                 std::string(ended.message()));
    // A watch that ends at once (etcd refusing it) is not retried in a tight loop.
    if (absl::Now() - started < kRetry) Pause(kRetry);
  }
}

std::optional<NodeRecord> EtcdDiscovery::PeerOf(const EtcdKeyValue& kv) {
  const std::string node = kv.key.substr(options_.prefix.size());
  absl::StatusOr<NodeRecord> record = DecodeNodeRecord(kv.value);
  if (!record.ok()) {
    spdlog::warn("etcd: {} is not a node record, ignored: {}", Echo(kv.key),
                 std::string(record.status().message()));
    return std::nullopt;
  }
  if (record->node != node) {
    spdlog::warn("etcd: {} holds the record of node {}, ignored", Echo(kv.key), record->node);
    return std::nullopt;
  }
  if (node == options_.self.node) {
    if (record->incarnation != options_.self.incarnation) {
      spdlog::warn("etcd: another agent (incarnation {:x}, at {}) registers as this node {}",
                   record->incarnation, record->address, node);
    }
    return std::nullopt;
  }
  return *std::move(record);
}

void EtcdDiscovery::Sync(const EtcdRange& range) {
  std::map<std::string, std::string> found;  // node -> address
  bool ours = false;
  for (const auto& kv : range.kvs) {
    if (kv.key == key()) ours = IsOurs(kv);
    if (auto record = PeerOf(kv)) found[record->node] = record->address;
  }
  // Before our first registration the register thread puts it anyway; after, it is missing
  // or not ours only if someone removed or overwrote it.
  if (!ours) AskReclaim("is missing or holds another record");
  for (auto it = known_.begin(); it != known_.end();) {
    if (found.contains(*it)) {
      ++it;
      continue;
    }
    std::string change = peers_->Remove(*it, PeerSource::kEtcd);
    if (!change.empty()) spdlog::info("etcd: {} is gone: {}", *it, change);
    it = known_.erase(it);
  }
  for (const auto& [node, address] : found) {
    std::string change = peers_->Upsert(node, address, PeerSource::kEtcd);
    if (!change.empty()) spdlog::info("etcd: {}", change);
    known_.insert(node);
  }
}

void EtcdDiscovery::Apply(const EtcdEvent& event) {
  if (!absl::StartsWith(event.kv.key, options_.prefix)) return;
  const std::string node = event.kv.key.substr(options_.prefix.size());
  if (node == options_.self.node) {
    // Our own key: a delete not of our doing (our revoke ends the watch first), or a record
    // that is not the one we put.
    if (event.type == EtcdEvent::Type::kDelete) {
      AskReclaim("was deleted");
    } else if (!IsOurs(event.kv)) {
      PeerOf(event.kv);  // warns about another agent registering as this node
      AskReclaim("was overwritten with another record");
    }
    return;
  }
  if (event.type == EtcdEvent::Type::kDelete) {
    if (known_.erase(node) == 0) return;
    std::string change = peers_->Remove(node, PeerSource::kEtcd);
    if (!change.empty()) {
      spdlog::info("etcd: {} deregistered or its lease lapsed: {}", node, change);
    }
    return;
  }
  std::optional<NodeRecord> record = PeerOf(event.kv);
  if (!record) return;
  std::string change = peers_->Upsert(node, record->address, PeerSource::kEtcd);
  known_.insert(node);
  if (!change.empty()) spdlog::info("etcd: {}", change);
}

}  // namespace ferry::server
