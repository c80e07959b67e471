#pragma once
// The verbs provider: one-sided WRITE / WRITE-with-immediate / READ over RC queue pairs on
// rdma-core. Every ibverbs call goes through a VerbsApi (production: RdmaCoreApi(); tests:
// the software verbs model).
//
// Handshake (bytes through the Peer Connect call): BeginConnect creates the initiator QP and
// sends its QpAddress; AcceptConnect creates a target QP, brings it to RTS and answers with
// its own; Finish brings the initiator QP to RTS.
//
// A device that goes away (`rdma link delete`, a driver unbind: its uverbs node vanishes;
// or IBV_EVENT_DEVICE_FATAL) is closed by the fabric's watcher at once, since the kernel's
// removal of a driver without disassociate_ucontext (rxe, siw) waits until every context is
// closed and tells no one: ops fail with the cause, health() says it, peers' slices take
// their next provider. When a device of that name is listed again, it is opened, every
// region registered again (new keys: the keys-changed handler runs), and health() is OK.

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/fabric.h"
#include "transport/verbs/retired_qps.h"
#include "transport/verbs/target_qp.h"
#include "transport/verbs/verbs_api.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_options.h"
#include "transport/verbs/verbs_region.h"

namespace ferry::verbs {

class VerbsFabric : public fabric::Fabric {
 public:
  // Opens the device and port. UNAVAILABLE "ibv_get_device_list: no RDMA devices (ENOSYS)"
  // on a machine without RDMA; the registry then skips the provider.
  static absl::StatusOr<std::unique_ptr<VerbsFabric>> Create(const VerbsOptions& options,
                                                             std::shared_ptr<VerbsApi> api);
  // Stops the watcher and closes the target QPs. Regions and endpoints keep the device open
  // until they go.
  ~VerbsFabric() override;

  // How often the watcher looks for a removed or fatal device, and for it coming back.
  static constexpr absl::Duration kWatchEvery = absl::Milliseconds(100);
  static constexpr absl::Duration kReopenEvery = absl::Milliseconds(500);

  std::string provider() const override { return "verbs"; }
  fabric::RailId rail() const override { return {provider(), port().device}; }
  // "mlx5_0:1/ib/lid=0x12" or "mlx5_0:1/roce/::ffff:10.0.0.1": what peers see in Hello.
  std::string address() const override;
  // The device's health (port down, device lost), or why the operator suspended it.
  absl::Status health() const override;
  uint32_t endpoints_per_peer() const override { return options_.qps_per_peer; }
  // Closes the target QPs (their initiators' ops fail with transport errors) and refuses
  // AcceptConnect until Resume. Incoming bytes are the NIC's work, counted by its port
  // counters (sysfs), not here: served() stays zero.
  absl::Status Suspend(const std::string& why) override;
  void Resume() override;
  absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> Register(void* data, uint64_t length,
                                                                 uint32_t access) override;
  absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterDmabuf(
      void* data, uint64_t length, const fabric::DmabufHandle& dmabuf,
      uint32_t access) override;
  absl::StatusOr<std::unique_ptr<fabric::PendingConnection>> BeginConnect(
      const std::string& peer_address) override;
  absl::StatusOr<std::string> AcceptConnect(const std::string& request,
                                            const fabric::PeerInstance& from) override;
  void SetImmediateHandler(ImmediateHandler handler) override;
  // Runs (on the watcher thread) after a device opened again registered every region anew:
  // their keys changed, so the answers peers kept must go (the agent revokes them).
  void SetKeysChangedHandler(std::function<void(const std::string& why)> handler) override;

  // The device now in use (a closed one until it comes back). Devices closed stay alive
  // with the fabric, so references into them stay valid.
  const PortInfo& port() const { return Current()->port(); }
  const VerbsDevice& device() const { return *Current(); }
  // Times the device was closed, and opened again, since the fabric started.
  uint64_t closes() const;
  uint64_t reopens() const;
  // Target QPs alive (accepted and not yet reaped).
  size_t accepted_connections() const;

 private:
  VerbsFabric(std::shared_ptr<VerbsApi> api, std::shared_ptr<VerbsDevice> device,
              const VerbsOptions& options);
  std::shared_ptr<VerbsDevice> Current() const;
  // The watcher: closes a removed or fatal device, opens it again when it is back.
  void Watch();
  void CloseDevice(const std::shared_ptr<VerbsDevice>& device, const std::string& cause);
  bool Reopen();

  const std::shared_ptr<VerbsApi> api_;
  const VerbsOptions options_;  // options_.device: the device opened first, by name
  const uint64_t fabric_id_;
  const std::shared_ptr<ImmediateDispatch> immediates_;
  const std::shared_ptr<RetiredQps> retired_;
  const std::shared_ptr<RegionSet> regions_;

  mutable absl::Mutex mu_;
  std::shared_ptr<VerbsDevice> device_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<VerbsDevice>> closed_devices_ ABSL_GUARDED_BY(mu_);
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<TargetQp>> targets_ ABSL_GUARDED_BY(mu_);
  std::string suspended_ ABSL_GUARDED_BY(mu_);  // why, while suspended
  std::function<void(const std::string&)> keys_changed_ ABSL_GUARDED_BY(mu_);
  uint64_t closes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reopens_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace ferry::verbs
