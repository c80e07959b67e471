#include "transport/verbs/verbs_fabric.h"

#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "base/status_macros.h"
#include "transport/verbs/handshake.h"
#include "transport/verbs/initiator_qp.h"
#include "transport/verbs/verbs_endpoint.h"
#include "transport/verbs/verbs_region.h"

namespace ferry::verbs {
namespace {

std::string AddressOf(const PortInfo& port) {
  if (port.is_roce()) {
    return absl::StrFormat("%s:%d/roce/%s", port.device, port.port, GidToString(port.gid));
  }
  return absl::StrFormat("%s:%d/ib/lid=0x%x", port.device, port.port, port.lid);
}

uint64_t RandomId() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd() | 1;
}

class VerbsPendingConnection : public fabric::PendingConnection {
 public:
  VerbsPendingConnection(std::shared_ptr<InitiatorQp> qp, std::string request,
                         std::string peer_address, std::shared_ptr<RetiredQps> retired)
      : qp_(std::move(qp)),
        request_(std::move(request)),
        peer_address_(std::move(peer_address)),
        retired_(std::move(retired)) {}

  const std::string& request() const override { return request_; }

  absl::StatusOr<std::shared_ptr<fabric::Endpoint>> Finish(const std::string& reply) override {
    if (!qp_) return absl::FailedPreconditionError("verbs: Finish() called twice");
    ASSIGN_OR_RETURN(QpAddress remote, ParseQpAddress(reply));
    RETURN_IF_ERROR(qp_->Connect(remote));
    return std::shared_ptr<fabric::Endpoint>(
        new VerbsEndpoint(std::move(qp_), peer_address_, retired_));
  }

 private:
  std::shared_ptr<InitiatorQp> qp_;
  const std::string request_;
  const std::string peer_address_;
  const std::shared_ptr<RetiredQps> retired_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<VerbsFabric>> VerbsFabric::Create(const VerbsOptions& options,
                                                                 std::shared_ptr<VerbsApi> api) {
  if (options.signal_every == 0)
    return absl::InvalidArgumentError("verbs: signal_every must be >= 1");
  if (options.retry_cnt > 7 || options.rnr_retry > 7 || options.timeout > 31) {
    return absl::InvalidArgumentError("verbs: retry_cnt and rnr_retry are 0..7, timeout 0..31");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<VerbsDevice> device, VerbsDevice::Open(api, options));
  // Opened again by name: an automatic pick keeps the device it made.
  VerbsOptions named = options;
  named.device = device->port().device;
  return std::unique_ptr<VerbsFabric>(new VerbsFabric(std::move(api), std::move(device), named));
}

VerbsFabric::VerbsFabric(std::shared_ptr<VerbsApi> api, std::shared_ptr<VerbsDevice> device,
                         const VerbsOptions& options)
    : api_(std::move(api)),
      options_(options),
      fabric_id_(RandomId()),
      immediates_(std::make_shared<ImmediateDispatch>()),
      retired_(std::make_shared<RetiredQps>()),
      regions_(std::make_shared<RegionSet>()),
      device_(std::move(device)),
      address_(AddressOf(device_->port())) {
  watcher_ = std::thread([this] { Watch(); });
}

VerbsFabric::~VerbsFabric() {
  std::vector<std::shared_ptr<TargetQp>> targets;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  watcher_.join();
  {
    absl::MutexLock lock(&mu_);
    targets.swap(targets_);
  }
  for (auto& t : targets) t->Close();
}

std::shared_ptr<VerbsDevice> VerbsFabric::Current() const {
  absl::MutexLock lock(&mu_);
  return device_;
}

std::string VerbsFabric::address() const {
  absl::MutexLock lock(&mu_);
  return address_;
}

uint64_t VerbsFabric::closes() const {
  absl::MutexLock lock(&mu_);
  return closes_;
}

uint64_t VerbsFabric::reopens() const {
  absl::MutexLock lock(&mu_);
  return reopens_;
}

void VerbsFabric::SetKeysChangedHandler(std::function<void(const std::string&)> handler) {
  absl::MutexLock lock(&mu_);
  keys_changed_ = std::move(handler);
}

void VerbsFabric::Watch() {
  absl::Time next_reopen = absl::InfinitePast();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), kWatchEvery)) return;
    }
    std::shared_ptr<VerbsDevice> device = Current();
    if (!device->closed()) {
      // DEVICE_FATAL (a driver with disassociate_ucontext, mlx5, sends it on removal too), or
      // the uverbs node gone with no event at all (rxe, siw).
      if (device->lost()) {
        CloseDevice(device, std::string(device->health().message()));
      } else if (device->Removed()) {
        CloseDevice(device, absl::StrCat("verbs: ", device->port().device,
                                         " was removed (its uverbs device is gone)"));
      }
      continue;
    }
    if (absl::Now() < next_reopen) continue;
    next_reopen = absl::Now() + kReopenEvery;
    Reopen();
  }
}

void VerbsFabric::CloseDevice(const std::shared_ptr<VerbsDevice>& device,
                              const std::string& cause) {
  const std::string name = device->port().device;
  spdlog::warn("{}; closing {} so that the kernel can finish with it: its ops fail, its "
               "slices take the next provider until a device named {} is back",
               cause, name, name);
  device->Close(absl::UnavailableError(cause));
  std::vector<std::shared_ptr<TargetQp>> targets;
  {
    absl::MutexLock lock(&mu_);
    ++closes_;
    targets.swap(targets_);
  }
  for (auto& t : targets) t->Close();  // released with the device: only forgotten here
}

bool VerbsFabric::Reopen() {
  absl::StatusOr<std::shared_ptr<VerbsDevice>> opened = VerbsDevice::Open(api_, options_);
  if (!opened.ok()) {
    spdlog::debug("verbs: {} not back yet: {}", options_.device, opened.status().ToString());
    return false;
  }
  std::shared_ptr<VerbsDevice> device = std::move(*opened);
  // Every region on the new device before anyone may connect through it.
  absl::Status first_error;
  const size_t regions = regions_->size();
  const size_t failed = regions_->BindAll(device, &first_error);
  std::function<void(const std::string&)> keys_changed;
  {
    absl::MutexLock lock(&mu_);
    closed_devices_.push_back(std::move(device_));
    device_ = device;
    address_ = AddressOf(device->port());
    ++reopens_;
    keys_changed = keys_changed_;
  }
  const std::string why = absl::StrFormat("verbs: %s is back: opened again, %d of %d regions "
                                          "registered again (new keys)",
                                          options_.device, regions - failed, regions);
  if (failed > 0) {
    spdlog::warn("{}; {} failed, the first: {}", why, failed, first_error.ToString());
  } else {
    spdlog::warn("{}; the rail carries again", why);
  }
  if (keys_changed) keys_changed(why);
  return true;
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> VerbsFabric::Register(void* data,
                                                                            uint64_t length,
                                                                            uint32_t access) {
  return RegisterHost(regions_, Current(), data, length, access);
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> VerbsFabric::RegisterDmabuf(
    void* data, uint64_t length, const fabric::DmabufHandle& dmabuf, uint32_t access) {
  return verbs::RegisterDmabuf(regions_, Current(), data, length, dmabuf, access);
}

absl::StatusOr<std::unique_ptr<fabric::PendingConnection>> VerbsFabric::BeginConnect(
    const std::string& peer_address) {
  // A RoCE port cannot reach an InfiniBand one: say so before creating anything.
  const std::shared_ptr<VerbsDevice> device = Current();
  RETURN_IF_ERROR(device->health());
  const std::string address = AddressOf(device->port());
  const bool peer_roce = absl::StrContains(peer_address, "/roce/");
  const bool peer_ib = absl::StrContains(peer_address, "/ib/");
  if ((peer_roce && !device->port().is_roce()) || (peer_ib && device->port().is_roce())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "verbs: peer ", peer_address, " and our ", address, " are on different link layers"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<InitiatorQp> qp, InitiatorQp::Create(device, options_));
  QpAddress local = qp->LocalAddress();
  local.fabric_id = fabric_id_;
  local.retired_qpns = retired_->Take(peer_address);
  return std::unique_ptr<fabric::PendingConnection>(new VerbsPendingConnection(
      std::move(qp), SerializeQpAddress(local), peer_address, retired_));
}

absl::StatusOr<std::string> VerbsFabric::AcceptConnect(const std::string& request,
                                                       const fabric::PeerInstance& from) {
  RETURN_IF_ERROR(health());
  ASSIGN_OR_RETURN(QpAddress remote, ParseQpAddress(request));
  // Before adding a QP, free those nobody can use any more: the ones this initiator says it
  // gave up, those that died, and every one an earlier incarnation of the same agent left
  // behind (an RC target never notices that its initiator restarted: it just waits).
  auto stale = [&](const TargetQp& t) {
    const bool retired = t.initiator() == remote.fabric_id &&
                         std::find(remote.retired_qpns.begin(), remote.retired_qpns.end(),
                                   t.qpn()) != remote.retired_qpns.end();
    const fabric::PeerInstance& was = t.initiator_agent();
    const bool restarted = !from.node.empty() && from.incarnation != 0 && was.node == from.node &&
                           was.incarnation != 0 && was.incarnation != from.incarnation;
    return retired || restarted || t.dead();
  };
  std::vector<std::shared_ptr<TargetQp>> reaped;
  {
    absl::MutexLock lock(&mu_);
    std::erase_if(targets_, [&](const std::shared_ptr<TargetQp>& t) {
      if (!stale(*t)) return false;
      reaped.push_back(t);
      return true;
    });
  }
  for (auto& t : reaped) t->Close();
  ASSIGN_OR_RETURN(std::shared_ptr<TargetQp> target,
                   TargetQp::Create(Current(), options_, from, remote.fabric_id, immediates_));
  if (absl::Status s = target->Accept(remote); !s.ok()) {
    target->Close();
    return s;
  }
  QpAddress local = target->LocalAddress();
  local.fabric_id = fabric_id_;
  {
    absl::MutexLock lock(&mu_);
    targets_.push_back(target);
  }
  return SerializeQpAddress(local);
}

absl::Status VerbsFabric::health() const {
  RETURN_IF_ERROR(Current()->health());
  absl::MutexLock lock(&mu_);
  if (suspended_.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("verbs ", options_.device, ": ", suspended_));
}

absl::Status VerbsFabric::Suspend(const std::string& why) {
  std::vector<std::shared_ptr<TargetQp>> targets;
  {
    absl::MutexLock lock(&mu_);
    suspended_ = why.empty() ? "suspended" : why;
    targets.swap(targets_);
  }
  for (auto& t : targets) t->Close();
  return absl::OkStatus();
}

void VerbsFabric::Resume() {
  absl::MutexLock lock(&mu_);
  suspended_.clear();
}

void VerbsFabric::SetImmediateHandler(ImmediateHandler handler) {
  immediates_->Set(std::move(handler));
}

size_t VerbsFabric::accepted_connections() const {
  absl::MutexLock lock(&mu_);
  size_t alive = 0;
  for (const auto& t : targets_) alive += !t->dead();
  return alive;
}

}  // namespace ferry::verbs
