#include "transport/verbs/verbs_device.h"

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"
#include "transport/verbs/handshake.h"

namespace ferry::verbs {
namespace {

absl::Status CallError(int rc, const std::string& call) {
  int err = rc > 0 ? rc : errno;
  return absl::ErrnoToStatus(err, call);
}

bool IsIpv4Mapped(const ibv_gid& gid) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, kPrefix, sizeof(kPrefix)) == 0;
}

// fe80::/10: a RoCE v2 GID made from the netdev's IPv6 link-local address.
bool IsLinkLocal(const ibv_gid& gid) { return gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80; }

bool IsZero(const ibv_gid& gid) {
  static const ibv_gid kZero = {};
  return std::memcmp(gid.raw, kZero.raw, 16) == 0;
}

// RoCE: the GID entry that names our port for RoCE v2 (UDP/IP encapsulation, routable).
// Auto pick prefers an IPv4-mapped address (what most RoCE fabrics route, and NCCL's default
// address family), then any other RoCE v2 entry.
absl::Status PickGid(VerbsApi& api, ibv_context* ctx, const ibv_port_attr& attr, int wanted,
                     PortInfo& port) {
  if (wanted >= 0) {
    ibv_gid_entry entry = {};
    if (int rc = api.QueryGidEx(ctx, port.port, wanted, &entry); rc != 0) {
      return CallError(rc, absl::StrFormat("ibv_query_gid_ex(%s port %d, index %d)", port.device,
                                           port.port, wanted));
    }
    if (port.is_roce() && entry.gid_type != IBV_GID_TYPE_ROCE_V2) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "verbs: %s port %d GID index %d (%s) is not RoCE v2 (type %d)", port.device, port.port,
          wanted, GidToString(entry.gid), entry.gid_type));
    }
    port.gid_index = wanted;
    port.gid = entry.gid;
    return absl::OkStatus();
  }
  int best = -1, fallback = -1, link_local = 0;
  ibv_gid best_gid = {}, fallback_gid = {};
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid_entry entry = {};
    // Empty slots answer ENODATA; they are simply skipped.
    if (api.QueryGidEx(ctx, port.port, i, &entry) != 0 || IsZero(entry.gid)) continue;
    if (!port.is_roce()) {
      port.gid_index = i;
      port.gid = entry.gid;
      return absl::OkStatus();
    }
    if (entry.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
    if (IsLinkLocal(entry.gid)) {
      // fe80::/10 does not route off the link: never picked unless asked for by index.
      ++link_local;
      continue;
    }
    if (IsIpv4Mapped(entry.gid) && best < 0) {
      best = i;
      best_gid = entry.gid;
    } else if (fallback < 0) {
      fallback = i;
      fallback_gid = entry.gid;
    }
  }
  if (best < 0) {
    best = fallback;
    best_gid = fallback_gid;
  }
  if (best < 0) {
    if (!port.is_roce()) return absl::OkStatus();  // InfiniBand works by LID alone
    return absl::FailedPreconditionError(absl::StrFormat(
        "verbs: %s port %d has no routable RoCE v2 GID (%d entries%s); is an IP address "
        "configured on its netdev?",
        port.device, port.port, attr.gid_tbl_len,
        link_local > 0 ? absl::StrFormat("; %d link-local fe80:: skipped: they do not route, "
                                         "set verbs.gid_index to use one anyway",
                                         link_local)
                       : ""));
  }
  port.gid_index = best;
  port.gid = best_gid;
  return absl::OkStatus();
}

// Fills `port` from the device and the chosen port. NOT_FOUND / FAILED_PRECONDITION when the
// device has no usable port.
absl::Status DescribePort(VerbsApi& api, ibv_context* ctx, const VerbsOptions& options,
                          PortInfo& port) {
  ibv_device_attr dev = {};
  if (int rc = api.QueryDevice(ctx, &dev); rc != 0) {
    return CallError(rc, absl::StrCat("ibv_query_device(", port.device, ")"));
  }
  port.max_qp_wr = dev.max_qp_wr;
  port.max_cqe = dev.max_cqe;
  port.max_cq = dev.max_cq;
  port.max_sge = dev.max_sge;
  port.max_qp_rd_atom = dev.max_qp_rd_atom;
  port.max_qp_init_rd_atom = dev.max_qp_init_rd_atom;
  std::vector<std::string> seen;
  for (uint32_t p = 1; p <= dev.phys_port_cnt; ++p) {
    if (options.port != 0 && p != options.port) continue;
    ibv_port_attr attr = {};
    if (int rc = api.QueryPort(ctx, static_cast<uint8_t>(p), &attr); rc != 0) {
      return CallError(rc, absl::StrFormat("ibv_query_port(%s, %d)", port.device, p));
    }
    if (attr.state != IBV_PORT_ACTIVE) {
      seen.push_back(absl::StrFormat("port %d is %s", p, ibv_port_state_str(attr.state)));
      continue;
    }
    port.port = static_cast<uint8_t>(p);
    port.link_layer = attr.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
                                                                  : IBV_LINK_LAYER_INFINIBAND;
    port.lid = attr.lid;
    port.active_mtu = attr.active_mtu;
    port.grh_required = !port.is_roce() && (attr.flags & IBV_QPF_GRH_REQUIRED) != 0;
    port.max_msg_sz = attr.max_msg_sz;
    return PickGid(api, ctx, attr, options.gid_index, port);
  }
  if (options.port != 0 && seen.empty()) {
    return absl::NotFoundError(absl::StrFormat("verbs: %s has no port %d (it has %d)", port.device,
                                               options.port, dev.phys_port_cnt));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "verbs: %s has no active port (%s)", port.device, absl::StrJoin(seen, ", ")));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> DeviceNames(VerbsApi& api) {
  int count = 0;
  errno = 0;
  ibv_device** list = api.GetDeviceList(&count);
  if (list == nullptr) {
    int err = errno;
    return absl::UnavailableError(absl::StrCat("ibv_get_device_list: no RDMA devices (",
                                               ErrnoName(err), ")"));
  }
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.push_back(api.GetDeviceName(list[i]));
  api.FreeDeviceList(list);
  if (names.empty())
    return absl::UnavailableError("ibv_get_device_list: no RDMA devices (0 found)");
  return names;
}

absl::StatusOr<std::shared_ptr<VerbsDevice>> VerbsDevice::Open(std::shared_ptr<VerbsApi> api,
                                                               const VerbsOptions& options) {
  int count = 0;
  errno = 0;
  ibv_device** list = api->GetDeviceList(&count);
  if (list == nullptr) {
    // Without kernel RDMA support rdma-core answers NULL with ENOSYS, not an empty list.
    int err = errno;
    return absl::UnavailableError(absl::StrCat("ibv_get_device_list: no RDMA devices (",
                                               ErrnoName(err), ")"));
  }
  std::unique_ptr<ibv_device*, std::function<void(ibv_device**)>> owned(
      list, [&api](ibv_device** l) { api->FreeDeviceList(l); });
  if (count == 0) return absl::UnavailableError("ibv_get_device_list: no RDMA devices (0 found)");

  std::vector<std::string> why;
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) {
    std::string name = api->GetDeviceName(list[i]);
    names.push_back(name);
    if (!options.device.empty() && name != options.device) continue;
    ContextPtr context(api->OpenDevice(list[i]), ContextDeleter{api.get()});
    if (!context) {
      absl::Status s = CallError(-1, absl::StrCat("ibv_open_device(", name, ")"));
      if (!options.device.empty()) return s;
      why.push_back(std::string(s.message()));
      continue;
    }
    PortInfo port;
    port.device = name;
    absl::Status s = DescribePort(*api, context.get(), options, port);
    if (!s.ok()) {
      if (!options.device.empty()) return s;
      why.push_back(std::string(s.message()));
      continue;
    }
    std::shared_ptr<VerbsDevice> device(new VerbsDevice(api, std::move(context), port));
    device->res_->pd = PdPtr(api->AllocPd(device->context()), PdDeleter{api.get()});
    if (!device->res_->pd) return CallError(-1, absl::StrCat("ibv_alloc_pd(", name, ")"));
    Resources& res = *device->res_;
    res.poller = std::make_unique<CompletionPoller>(api.get(), name);
    CompletionPoller* poller = res.poller.get();
    res.cqs = std::make_unique<CqPool>(api.get(), device->context(), name, options.cq_depth,
                                       port.max_cqe, port.max_cq,
                                       [poller](ibv_cq* cq) { poller->AddCq(cq); });
    ASSIGN_OR_RETURN(res.events,
                     AsyncEventReader::Start(api.get(), device->context(), name,
                                             [&res, p = port.port](const AsyncEventMeaning& e) {
                                               OnAsyncEvent(res, p, e);
                                             }));
    return device;
  }
  if (!options.device.empty()) {
    return absl::NotFoundError(absl::StrCat("verbs: no RDMA device '", options.device,
                                            "' (found: ", absl::StrJoin(names, ", "), ")"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("verbs: no usable RDMA port: ", absl::StrJoin(why, "; ")));
}

VerbsDevice::VerbsDevice(std::shared_ptr<VerbsApi> api, ContextPtr context, PortInfo port)
    : res_(new Resources{std::move(api), std::move(context)}), port_(std::move(port)) {}

VerbsDevice::~VerbsDevice() {
  if (OnDeviceThread()) {
    // The last reference went inside a completion callback (or one an async event ran): that
    // thread cannot join itself, and the CQs must outlive their polling. Another thread tears
    // down, in order, once this one has returned from the callback.
    std::thread([res = std::move(res_)]() mutable { res.reset(); }).detach();
  }
}

bool VerbsDevice::WhileOpen(absl::FunctionRef<void()> make) {
  absl::ReaderMutexLock lock(&res_->life);
  if (res_->closed) return false;
  make();
  return true;
}

void VerbsDevice::Attach(DeviceUser* user) {
  absl::MutexLock lock(&res_->users_mu);
  res_->users.insert(user);
}

void VerbsDevice::Detach(DeviceUser* user) {
  absl::MutexLock lock(&res_->users_mu);
  res_->users.erase(user);
}

bool VerbsDevice::lost() const {
  absl::MutexLock lock(&res_->health.mu);
  return res_->health.device_lost;
}

bool VerbsDevice::Removed() const {
  absl::ReaderMutexLock lock(&res_->life);
  return !res_->closed && res_->api->DeviceRemoved(res_->context.get());
}

bool VerbsDevice::closed() const {
  absl::ReaderMutexLock lock(&res_->life);
  return res_->closed;
}

void VerbsDevice::Close(const absl::Status& why) {
  {
    absl::MutexLock lock(&res_->health.mu);
    if (res_->health.closing) return;
    res_->health.closing = true;
    res_->health.device_lost = true;
    res_->health.status = why;
  }
  // Every op in flight fails now with the cause; none of their completions will come.
  res_->poller->FailAll(why, /*completions_lost=*/true);
  // No thread reads the CQs or the async fd from here on.
  res_->events.reset();
  res_->poller->Stop();
  // The QPs' routes, dropped last (after `life` below is let go): a QP's destructor takes the
  // device's locks. Released QPs return from Close without touching the poller, so their
  // routes go here, or each would keep its QP, and through it this device, alive (make
  // test-asan's LeakSanitizer found that cycle after a device removal).
  std::vector<std::shared_ptr<CompletionSink>> routes;
  absl::MutexLock life(&res_->life);
  res_->closed = true;
  size_t released = 0;
  {
    absl::MutexLock lock(&res_->users_mu);
    for (DeviceUser* user : res_->users) user->ReleaseFromDevice();
    released = res_->users.size();
    res_->users.clear();
  }
  routes = res_->poller->TakeAll();
  // In the order the kernel needs them gone (a CQ after its QPs, the PD after its MRs and
  // QPs); closing the context releases the uverbs file the removal waits for.
  res_->cqs.reset();
  res_->pd.reset();
  res_->context.reset();
  spdlog::info("verbs: {} closed ({} QPs and registrations released)", port_.device, released);
}

absl::Status VerbsDevice::health() const {
  absl::MutexLock lock(&res_->health.mu);
  return res_->health.status;
}

void VerbsDevice::OnAsyncEvent(Resources& res, uint8_t port, const AsyncEventMeaning& event) {
  const absl::Status why = absl::UnavailableError(absl::StrCat("verbs: ", event.text));
  switch (event.kind) {
    case AsyncEventMeaning::kQpBroken:
      res.poller->FailQp(event.qpn, why);
      return;
    case AsyncEventMeaning::kCqBroken:
      res.poller->FailCq(event.cq, why);
      return;
    case AsyncEventMeaning::kPortDown:
    case AsyncEventMeaning::kPortUp: {
      if (event.port != port) return;  // another port of the device: not ours
      const bool down = event.kind == AsyncEventMeaning::kPortDown;
      {
        absl::MutexLock lock(&res.health.mu);
        if (res.health.device_lost) return;
        res.health.status = down ? why : absl::OkStatus();
      }
      // Every QP on a down port fails once its transport retries run out (seconds with the
      // default timeout); failing them now lets their owners reconnect, or fail over, at once.
      // Their posted WRs still flush through the CQ.
      if (down) res.poller->FailAll(why, /*completions_lost=*/false);
      return;
    }
    case AsyncEventMeaning::kDeviceLost: {
      {
        absl::MutexLock lock(&res.health.mu);
        res.health.device_lost = true;
        res.health.status = why;
      }
      res.poller->FailAll(why, /*completions_lost=*/true);
      return;
    }
    case AsyncEventMeaning::kInformational:
      return;
  }
}

QpAddress VerbsDevice::AddressOf(uint32_t qpn, uint32_t psn) const {
  QpAddress a;
  a.link_layer = port_.link_layer;
  a.mtu = port_.active_mtu;
  a.qpn = qpn;
  a.psn = psn;
  a.lid = port_.lid;
  a.gid = port_.gid;
  return a;
}

}  // namespace ferry::verbs
