#pragma once
// The seam: every ibverbs entry point the verbs provider uses, and nothing else. Production
// binds it to rdma-core (RdmaCoreApi); tests bind it to a software model of an HCA
// (tests/verbs_model). Types are rdma-core's own structs, never re-declared.
//
// Each method behaves like the ibv_* call it is named after: pointers are NULL and ints are
// non-zero on failure, with the reason in errno (ints return it too, as rdma-core does).
// ibv_wc_status_str() is not here: it is a pure lookup table with no device behind it.

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

namespace ferry::verbs {

class VerbsApi {
 public:
  virtual ~VerbsApi() = default;

  virtual ibv_device** GetDeviceList(int* num_devices) = 0;
  virtual void FreeDeviceList(ibv_device** list) = 0;
  virtual const char* GetDeviceName(ibv_device* device) = 0;
  virtual ibv_context* OpenDevice(ibv_device* device) = 0;
  virtual int CloseDevice(ibv_context* context) = 0;
  // Whether the device of `context` was removed (`rdma link delete`, a driver unbind): its
  // uverbs node (ibv_device::dev_path, /sys/class/infiniband_verbs/uverbsN) is gone. The
  // kernel deletes that node first (ib_uverbs_remove_one, drivers/infiniband/core/
  // uverbs_main.c: cdev_device_del) and then, for a driver without disassociate_ucontext
  // (rxe, siw), waits until every open context is closed, telling no one: polling this is the
  // only way a holder learns it must let go. Not an ibverbs call: a stat of sysfs.
  virtual bool DeviceRemoved(ibv_context* context) = 0;

  virtual int QueryDevice(ibv_context* context, ibv_device_attr* attr) = 0;
  virtual int QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) = 0;
  // ibv_query_gid_ex: the GID and its type (IB, RoCE v1, RoCE v2). ENODATA for an empty slot.
  virtual int QueryGidEx(ibv_context* context, uint32_t port, uint32_t index,
                         ibv_gid_entry* entry) = 0;

  virtual ibv_pd* AllocPd(ibv_context* context) = 0;
  virtual int DeallocPd(ibv_pd* pd) = 0;

  virtual ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t length, int access) = 0;
  // ibv_reg_dmabuf_mr: [offset, offset+length) of the DMA-BUF `fd`, addressed by peers as
  // `iova`.
  virtual ibv_mr* RegDmabufMr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova,
                              int fd, int access) = 0;
  virtual int DeregMr(ibv_mr* mr) = 0;

  virtual ibv_cq* CreateCq(ibv_context* context, int cqe) = 0;
  virtual int DestroyCq(ibv_cq* cq) = 0;
  // `init->cap` is updated with what the device granted, as ibv_create_qp does.
  virtual ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* init) = 0;
  virtual int ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = 0;
  virtual int DestroyQp(ibv_qp* qp) = 0;

  // ibv_post_send / ibv_post_recv / ibv_poll_cq are static inline in verbs.h (they jump
  // through the provider's ops table), hence wrapped here rather than taken by address.
  virtual int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = 0;
  virtual int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) = 0;
  // Returns the number of completions written to `wc` (0..num), or < 0 on error.
  virtual int PollCq(ibv_cq* cq, int num, ibv_wc* wc) = 0;

  // ibv_get_async_event: the next asynchronous event of `context` (port up/down, QP fatal,
  // CQ error, device fatal). Blocks unless context->async_fd was made O_NONBLOCK; then -1
  // with errno EAGAIN when none is pending. Every event must be given back to
  // AckAsyncEvent: destroying the QP or CQ it names waits until it is (ibv_get_async_event(3)).
  virtual int GetAsyncEvent(ibv_context* context, ibv_async_event* event) = 0;
  virtual void AckAsyncEvent(ibv_async_event* event) = 0;
};

}  // namespace ferry::verbs
