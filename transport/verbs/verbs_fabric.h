#pragma once
// The verbs provider: one-sided WRITE / WRITE-with-immediate / READ over RC queue pairs on
// rdma-core. Every ibverbs call goes through a VerbsApi (production: RdmaCoreApi(); tests:
// the software verbs model).
//
// Handshake (bytes through the Peer Connect call): BeginConnect creates the initiator QP and
// sends its QpAddress; AcceptConnect creates a target QP, brings it to RTS and answers with
// its own; Finish brings the initiator QP to RTS.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/fabric.h"
#include "transport/verbs/retired_qps.h"
#include "transport/verbs/target_qp.h"
#include "transport/verbs/verbs_api.h"
#include "transport/verbs/verbs_device.h"
#include "transport/verbs/verbs_options.h"

namespace ferry::verbs {

class VerbsFabric : public fabric::Fabric {
 public:
  // Opens the device and port. UNAVAILABLE "ibv_get_device_list: no RDMA devices (ENOSYS)"
  // on a machine without RDMA; the registry then skips the provider.
  static absl::StatusOr<std::unique_ptr<VerbsFabric>> Create(const VerbsOptions& options,
                                                             std::shared_ptr<VerbsApi> api);
  // Closes the target QPs. Regions and endpoints keep the device open until they go.
  ~VerbsFabric() override;

  std::string provider() const override { return "verbs"; }
  fabric::RailId rail() const override { return {provider(), port().device}; }
  // "mlx5_0:1/ib/lid=0x12" or "mlx5_0:1/roce/::ffff:10.0.0.1": what peers see in Hello.
  std::string address() const override { return address_; }
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

  const PortInfo& port() const { return device_->port(); }
  const VerbsDevice& device() const { return *device_; }
  // Target QPs alive (accepted and not yet reaped).
  size_t accepted_connections() const;

 private:
  VerbsFabric(std::shared_ptr<VerbsDevice> device, const VerbsOptions& options);

  const std::shared_ptr<VerbsDevice> device_;
  const VerbsOptions options_;
  const uint64_t fabric_id_;
  const std::string address_;
  const std::shared_ptr<ImmediateDispatch> immediates_;
  const std::shared_ptr<RetiredQps> retired_;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<TargetQp>> targets_ ABSL_GUARDED_BY(mu_);
  std::string suspended_ ABSL_GUARDED_BY(mu_);  // why, while suspended
};

}  // namespace ferry::verbs
