// Client's calls for memory this process allocated itself: RegisterMemory (by address, by
// descriptor, by CUDA IPC handle), DeregisterMemory, and Poll for the handles of transfers
// over it.

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "base/status_macros.h"
#include "client/ferry_client.h"
#include "client/shared_memory.h"

namespace ferry {

absl::StatusOr<std::string> Client::FdSocket() {
  {
    absl::MutexLock lock(&mu_);
    if (!fd_socket_.empty()) return fd_socket_;
  }
  ASSIGN_OR_RETURN(ferry::v1::GetInfoResponse info, GetInfo());
  if (info.fd_socket().empty()) {
    return absl::FailedPreconditionError(
        "memory: this agent takes no descriptors (it has no local socket); registering "
        "memory needs a client on the agent's own node, over its Unix socket");
  }
  absl::MutexLock lock(&mu_);
  fd_socket_ = info.fd_socket();
  return fd_socket_;
}

absl::StatusOr<ferry::v1::RegisterMemoryResponse> Client::Register(
    ferry::v1::RegisterMemoryRequest req) {
  ferry::v1::RegisterMemoryResponse resp;
  auto ctx = Context();
  grpc::Status s = stub_->RegisterMemory(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

namespace {

// A RegisterMemory request for [offset, offset + length) of memory on `device`.
ferry::v1::RegisterMemoryRequest RangeRequest(uint64_t offset, uint64_t length,
                                              const std::string& device, const std::string& name,
                                              const std::vector<std::string>& allowed_peers) {
  ferry::v1::RegisterMemoryRequest req;
  req.set_offset(offset);
  req.set_length(length);
  req.set_device(device);
  req.set_name(name);
  for (const auto& p : allowed_peers) req.add_allowed_peers(p);
  return req;
}

}  // namespace

absl::StatusOr<ferry::v1::RegisterMemoryResponse> Client::RegisterDescriptor(
    int fd, uint64_t allocation_size, uint64_t offset, uint64_t length, const std::string& device,
    const std::string& name, const std::vector<std::string>& allowed_peers) {
  ASSIGN_OR_RETURN(std::string socket, FdSocket());
  ASSIGN_OR_RETURN(uint64_t ticket, PassFd(socket, fd));
  ferry::v1::RegisterMemoryRequest req = RangeRequest(offset, length, device, name, allowed_peers);
  req.set_fd_ticket(ticket);
  req.set_allocation_size(allocation_size);
  return Register(std::move(req));
}

absl::StatusOr<ferry::v1::RegisterMemoryResponse> Client::RegisterFd(
    int fd, uint64_t offset, uint64_t length, const std::string& device, const std::string& name,
    const std::vector<std::string>& allowed_peers) {
  return RegisterDescriptor(fd, 0, offset, length, device, name, allowed_peers);
}

absl::StatusOr<ferry::v1::RegisterMemoryResponse> Client::RegisterCudaVmm(
    int fd, uint64_t allocation_size, uint64_t offset, uint64_t length, const std::string& device,
    const std::string& name, const std::vector<std::string>& allowed_peers) {
  if (allocation_size == 0) {
    return absl::InvalidArgumentError("allocation_size: the VMM allocation's size, not 0");
  }
  return RegisterDescriptor(fd, allocation_size, offset, length, device, name, allowed_peers);
}

absl::StatusOr<ferry::v1::RegisterMemoryResponse> Client::RegisterMemory(
    const void* address, uint64_t length, const std::string& name,
    const std::vector<std::string>& allowed_peers) {
  ASSIGN_OR_RETURN(SharedFile file, FindSharedFile(address, length));
  return RegisterFd(file.fd.get(), file.offset, length, "host", name, allowed_peers);
}

absl::StatusOr<ferry::v1::RegisterMemoryResponse> Client::RegisterCudaIpc(
    const std::string& handle, uint64_t offset, uint64_t length, const std::string& device,
    const std::string& name, const std::vector<std::string>& allowed_peers) {
  ferry::v1::RegisterMemoryRequest req = RangeRequest(offset, length, device, name, allowed_peers);
  req.set_cuda_ipc_handle(handle);
  return Register(std::move(req));
}

absl::Status Client::DeregisterMemory(uint64_t id) {
  ferry::v1::DeregisterMemoryRequest req;
  req.set_id(id);
  ferry::v1::DeregisterMemoryResponse resp;
  auto ctx = Context();
  return FromGrpcStatus(stub_->DeregisterMemory(ctx.get(), req, &resp));
}

absl::StatusOr<ferry::v1::TransferResult> Client::Poll(uint64_t transfer_id, bool failed_ops) {
  ferry::v1::WaitRequest req;
  req.set_transfer_id(transfer_id);
  req.set_poll(true);
  req.set_include_ops(failed_ops);
  req.set_failed_only(failed_ops);
  ferry::v1::TransferResult resp;
  auto ctx = Context();
  grpc::Status s = stub_->Wait(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

}  // namespace ferry
