#include "transport/verbs/rdma_core_api.h"

#include <unistd.h>

#include <cerrno>

namespace ferry::verbs {
namespace {

class RdmaCore final : public VerbsApi {
 public:
  ibv_device** GetDeviceList(int* num) override { return ibv_get_device_list(num); }
  void FreeDeviceList(ibv_device** list) override { ibv_free_device_list(list); }
  const char* GetDeviceName(ibv_device* device) override { return ibv_get_device_name(device); }
  ibv_context* OpenDevice(ibv_device* device) override { return ibv_open_device(device); }
  int CloseDevice(ibv_context* context) override { return ibv_close_device(context); }
  bool DeviceRemoved(ibv_context* context) override {
    // Only ENOENT says gone: another failure (EACCES in a sandbox) says nothing.
    return access(context->device->dev_path, F_OK) != 0 && errno == ENOENT;
  }
  int QueryDevice(ibv_context* context, ibv_device_attr* attr) override {
    return ibv_query_device(context, attr);
  }
  int QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) override {
    return ibv_query_port(context, port, attr);
  }
  int QueryGidEx(ibv_context* context, uint32_t port, uint32_t index,
                 ibv_gid_entry* entry) override {
    return ibv_query_gid_ex(context, port, index, entry, 0);
  }
  ibv_pd* AllocPd(ibv_context* context) override { return ibv_alloc_pd(context); }
  int DeallocPd(ibv_pd* pd) override { return ibv_dealloc_pd(pd); }
  ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t length, int access) override {
    // verbs.h's ibv_reg_mr macro takes a non-constant access through ibv_reg_mr_iova2, which
    // drops optional flags (relaxed ordering) the device does not support.
    return ibv_reg_mr(pd, addr, length, access);
  }
  ibv_mr* RegDmabufMr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                      int access) override {
    return ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access);
  }
  int DeregMr(ibv_mr* mr) override { return ibv_dereg_mr(mr); }
  ibv_cq* CreateCq(ibv_context* context, int cqe) override {
    return ibv_create_cq(context, cqe, nullptr, nullptr, 0);
  }
  int DestroyCq(ibv_cq* cq) override { return ibv_destroy_cq(cq); }
  ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* init) override { return ibv_create_qp(pd, init); }
  int ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) override {
    return ibv_modify_qp(qp, attr, mask);
  }
  int DestroyQp(ibv_qp* qp) override { return ibv_destroy_qp(qp); }
  int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) override {
    return ibv_post_send(qp, wr, bad);
  }
  int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) override {
    return ibv_post_recv(qp, wr, bad);
  }
  int PollCq(ibv_cq* cq, int num, ibv_wc* wc) override { return ibv_poll_cq(cq, num, wc); }
  int GetAsyncEvent(ibv_context* context, ibv_async_event* event) override {
    return ibv_get_async_event(context, event);
  }
  void AckAsyncEvent(ibv_async_event* event) override { ibv_ack_async_event(event); }
};

}  // namespace

std::shared_ptr<VerbsApi> RdmaCoreApi() {
  static const std::shared_ptr<VerbsApi> api = std::make_shared<RdmaCore>();
  return api;
}

}  // namespace ferry::verbs
