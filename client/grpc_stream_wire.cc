// StreamWire over a gRPC call: Agent.TransferStream.

#include "base/grpc_status.h"
#include "client/stream_wire.h"

namespace ferry {
namespace {

class GrpcWire : public StreamWire {
 public:
  GrpcWire(std::unique_ptr<grpc::ClientContext> ctx,
           std::unique_ptr<grpc::ClientReaderWriter<ferry::v1::StreamedTransfer,
                                                    ferry::v1::StreamedResults>> call)
      : ctx_(std::move(ctx)), call_(std::move(call)) {}

  bool Write(const ferry::v1::StreamedTransfer& request) override { return call_->Write(request); }
  bool WritesDone() override { return call_->WritesDone(); }
  bool Read(ferry::v1::StreamedResults* results) override { return call_->Read(results); }
  void Cancel() override { ctx_->TryCancel(); }
  absl::Status Finish() override { return FromGrpcStatus(call_->Finish()); }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<ferry::v1::StreamedTransfer, ferry::v1::StreamedResults>>
      call_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StreamWire>> GrpcStreamWire(
    ferry::v1::Agent::Stub& stub, std::unique_ptr<grpc::ClientContext> ctx) {
  auto call = stub.TransferStream(ctx.get());
  if (call == nullptr) return absl::InternalError("TransferStream: gRPC gave no call");
  return std::make_unique<GrpcWire>(std::move(ctx), std::move(call));
}

}  // namespace ferry
