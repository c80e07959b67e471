#pragma once
// fabric::Endpoint over one RC queue pair (see InitiatorQp for how ops are carried).

#include <memory>
#include <mutex>
#include <string>

#include "transport/fabric.h"
#include "transport/verbs/initiator_qp.h"
#include "transport/verbs/retired_qps.h"

namespace ferry::verbs {

class VerbsEndpoint : public fabric::Endpoint {
 public:
  VerbsEndpoint(std::shared_ptr<InitiatorQp> qp, std::string peer_address,
                std::shared_ptr<RetiredQps> retired)
      : qp_(std::move(qp)), peer_address_(std::move(peer_address)), retired_(std::move(retired)) {}
  ~VerbsEndpoint() override { Close(); }

  absl::Status PostWrite(const fabric::LocalSlice& src, const fabric::RemoteSlice& dst,
                         fabric::Completion done) override {
    return qp_->Post(IBV_WR_RDMA_WRITE, src, dst, 0, std::move(done));
  }
  absl::Status PostWriteWithImmediate(const fabric::LocalSlice& src,
                                      const fabric::RemoteSlice& dst, uint32_t imm,
                                      fabric::Completion done) override {
    return qp_->Post(IBV_WR_RDMA_WRITE_WITH_IMM, src, dst, imm, std::move(done));
  }
  absl::Status PostRead(const fabric::LocalSlice& dst, const fabric::RemoteSlice& src,
                        fabric::Completion done) override {
    return qp_->Post(IBV_WR_RDMA_READ, dst, src, 0, std::move(done));
  }
  bool broken() const override { return qp_->broken(); }
  void Close() override;

  uint32_t qpn() const { return qp_->qpn(); }
  uint32_t remote_qpn() const { return qp_->remote_qpn(); }

 private:
  const std::shared_ptr<InitiatorQp> qp_;
  const std::string peer_address_;
  const std::shared_ptr<RetiredQps> retired_;
  std::once_flag retire_once_;
};

}  // namespace ferry::verbs
