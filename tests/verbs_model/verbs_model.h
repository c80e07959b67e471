#pragma once
// A software model of an HCA behind the verbs seam, for tests only (never linked into
// ferryd). It uses rdma-core's own structs and enforces what a real HCA enforces:
//
// - the RC QP state machine: RESET -> INIT -> RTR -> RTS with the attribute masks each step
//   requires (missing or foreign bits: EINVAL); posting sends outside RTS fails (EINVAL),
//   posting on a QP in ERR is accepted and flushed;
// - send/receive queue depth (ENOMEM) and CQ capacity: an overrun loses the CQE, puts the CQ
//   in error with an IBV_EVENT_CQ_ERR, and a QP that completes into an errored CQ enters ERR
//   with its outstanding WRs lost (no completion ever comes for them);
//   send queue slots come back only when a signalled completion is polled, as in libmlx5;
// - lkey / rkey, bounds and access flags: violations complete with IBV_WC_LOC_PROT_ERR /
//   IBV_WC_REM_ACCESS_ERR, move the requester QP to ERR and flush the rest with
//   IBV_WC_WR_FLUSH_ERR (the responder's memory is untouched);
// - the wire: two QPs reach each other only if each names the other's QPN, the address
//   matches the peer port (LID on InfiniBand, GID on RoCE), both ports are ACTIVE and the
//   start PSNs agree; else IBV_WC_RETRY_EXC_ERR once the transport retries are spent:
//   (retry_cnt + 1) x 4.096 us x 2^timeout after the WR reached the head of the queue, or
//   never when timeout is 0 (the IB spec's infinite timeout);
// - asynchronous events (ibv_get_async_event(3)) on the context's async_fd, a real eventfd:
//   the call blocks unless the fd is O_NONBLOCK (then EAGAIN); destroying a QP or CQ waits
//   until the events handed out for it are acknowledged (a real destroy waits forever; the
//   model gives up after 5 s with EBUSY and counts it);
// - in-order execution and completion per QP; WRITE-with-immediate consumes a posted
//   receive (none: RNR, retried forever when rnr_retry is 7, else IBV_WC_RNR_RETRY_EXC_ERR);
//   READ; messages above the port's max_msg_sz fail with IBV_WC_LOC_LEN_ERR;
// - RoCE path resolution: a modify that sets the address vector on an Ethernet port resolves
//   the destination GID's MAC first (ib_resolve_eth_dmac ->
//   rdma_addr_find_l2_eth_by_grh, drivers/infiniband/core/addr.c: rdma_resolve_ip with
//   1000 ms; process_one_req sets -ETIMEDOUT when the neighbour never answers). A GID no
//   ACTIVE Ethernet port holds blocks the call kNeighbourTimeout and fails ETIMEDOUT, as
//   INIT->RTR did between two rxe devices that could not reach each other (make test-rdma);
//   link-local GIDs carry their MAC and need no resolution;
// - memory registration as the kernel pins it (ib_umem_get): ibv_reg_mr needs CPU pages the
//   access may use, else EFAULT, so a device address (a simulated GPU's PROT_NONE range) is
//   refused unless peer memory is loaded and its table (transport/memory/peer_memory.h)
//   knows the range, as nvidia_peermem makes cudaMalloc pointers registrable;
// - port counters: the payload each port sent and received (sysfs port_xmit_data and
//   port_rcv_data), so tests can check which device carried what.
//
// Data moves on one model thread. Fault injection: fail the next N calls of a kind, force a
// QP into ERR, pause the data mover, take a port down and up (now, or once it has moved a
// given number of bytes: a link lost mid-transfer), raise a QP fatal event, lose a device
// (its QPs stop and never complete; an IBV_EVENT_DEVICE_FATAL says so).

#include <infiniband/verbs.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/verbs/verbs_api.h"

namespace ferry::verbs::model {

struct PortConfig {
  uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  ibv_port_state state = IBV_PORT_ACTIVE;
  uint16_t lid = 1;
  ibv_mtu active_mtu = IBV_MTU_4096;
  uint32_t max_msg_sz = 1u << 30;
  // ibv_port_attr.flags: IBV_QPF_GRH_REQUIRED on InfiniBand ports whose subnet manager
  // demands a GRH on every packet (ibv_query_port(3)); RTR without one is refused.
  uint8_t flags = 0;
  // P_Key table length: a QP's pkey_index must be below it (ibv_modify_qp(3): EINVAL).
  uint16_t pkey_tbl_len = 128;
  // The GID table; an entry with an all-zero GID is an empty slot (ENODATA).
  std::vector<ibv_gid_entry> gids;
};

struct DeviceConfig {
  std::string name = "mlx5_0";
  std::vector<PortConfig> ports = {PortConfig{}};
  int max_qp_wr = 32768;
  int max_cqe = 1 << 22;
  int max_cq = 1 << 24;
  int max_sge = 30;
  int max_qp_rd_atom = 16;
  int max_qp_init_rd_atom = 16;
  uint32_t max_inline_data = 256;
  // Whether the driver implements disassociate_ucontext. When a device is removed the kernel
  // (ib_uverbs_remove_one, drivers/infiniband/core/uverbs_main.c) deletes its uverbs cdev,
  // then either disassociates (IBV_EVENT_DEVICE_FATAL to every context, the removal returns)
  // or, without it, sends nothing and waits until every context is closed. mlx5 has it;
  // Soft-RoCE (rxe) and siw do not: `rdma link delete rxe0` hung in D state while ferryd held
  // the device and ferryd heard nothing (make test-rdma).
  bool disassociates = true;
};

// An InfiniBand device with one active port at `lid`.
DeviceConfig InfinibandDevice(const std::string& name, uint16_t lid);
// A RoCE device with one active Ethernet port whose GID table holds, like a real one: a
// link-local RoCE v1 and v2 pair, then the IPv4-mapped address as RoCE v1 (index 2) and v2
// (index 3).
DeviceConfig RoceDevice(const std::string& name, const std::string& ipv4);
// Soft-RoCE as the kernel's rdma_rxe: a RoCE device whose removal waits for its users.
DeviceConfig SoftRoceDevice(const std::string& name, const std::string& ipv4);
ibv_gid Ipv4MappedGid(const std::string& ipv4);

// How long the kernel waits for a RoCE destination's neighbour entry before INIT->RTR fails
// ETIMEDOUT (rdma_addr_find_l2_eth_by_grh's 1000 ms).
inline constexpr absl::Duration kNeighbourTimeout = absl::Milliseconds(1000);

enum class Call {
  kGetDeviceList, kOpenDevice, kAllocPd, kRegMr, kRegDmabufMr, kCreateCq, kCreateQp,
  kModifyQp, kPostSend, kPostRecv, kPollCq,
};

class VerbsModel : public VerbsApi {
 public:
  explicit VerbsModel(std::vector<DeviceConfig> devices);
  ~VerbsModel() override;

  // --- the seam ---
  ibv_device** GetDeviceList(int* num_devices) override;
  void FreeDeviceList(ibv_device** list) override;
  const char* GetDeviceName(ibv_device* device) override;
  ibv_context* OpenDevice(ibv_device* device) override;
  int CloseDevice(ibv_context* context) override;
  // True once RemoveDevice took the context's device away (its uverbs node is gone).
  bool DeviceRemoved(ibv_context* context) override;
  int QueryDevice(ibv_context* context, ibv_device_attr* attr) override;
  int QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) override;
  int QueryGidEx(ibv_context* context, uint32_t port, uint32_t index,
                 ibv_gid_entry* entry) override;
  ibv_pd* AllocPd(ibv_context* context) override;
  int DeallocPd(ibv_pd* pd) override;
  ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t length, int access) override;
  ibv_mr* RegDmabufMr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                      int access) override;
  int DeregMr(ibv_mr* mr) override;
  ibv_cq* CreateCq(ibv_context* context, int cqe) override;
  int DestroyCq(ibv_cq* cq) override;
  ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* init) override;
  int ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) override;
  int DestroyQp(ibv_qp* qp) override;
  int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) override;
  int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) override;
  int PollCq(ibv_cq* cq, int num, ibv_wc* wc) override;
  int GetAsyncEvent(ibv_context* context, ibv_async_event* event) override;
  void AckAsyncEvent(ibv_async_event* event) override;

  // --- fault injection ---
  // The next `times` calls of `call` fail with `err` (GetDeviceList: NULL with errno `err`).
  void FailNext(Call call, int err, int times = 1);
  // Moves a QP to ERR now, as a link failure would: outstanding WRs flush.
  void ForceError(uint32_t qpn);
  // While paused the data mover executes nothing; posted WRs wait.
  void SetPaused(bool paused);
  // Takes port `port` of `device` down (IBV_PORT_DOWN, with IBV_EVENT_PORT_ERR on every open
  // context of the device) or back up (IBV_EVENT_PORT_ACTIVE). Traffic through a down port
  // does not arrive: senders see IBV_WC_RETRY_EXC_ERR after their retries.
  void SetPortState(const std::string& device, uint8_t port, ibv_port_state state);
  // The link of port `port` of `device` fails once the port has moved `bytes` more payload
  // (sent and received, as PortCounters counts it): the data mover takes it down, as
  // SetPortState(IBV_PORT_DOWN), right after the work request that crossed the mark, so the
  // port's other posted work requests are caught in flight. That request completes: the
  // link went between its ACK and the next request's packets. (A link can also take an ACK
  // with it, failing a request whose bytes landed; this scenario does not.)
  void SetPortDownAfter(const std::string& device, uint8_t port, uint64_t bytes);
  // Moves a QP to ERR (outstanding WRs flush) and raises IBV_EVENT_QP_FATAL for it.
  void RaiseQpFatal(uint32_t qpn);
  // The device dies: its QPs stop where they are and no completion comes for anything they
  // had posted; later posts are accepted and never complete; IBV_EVENT_DEVICE_FATAL goes to
  // every open context.
  void LoseDevice(const std::string& device);
  // `rdma link delete`: the device leaves the device list and opens of it fail (ENODEV) at
  // once; then, per DeviceConfig::disassociates, it is lost as LoseDevice says and the call
  // returns true, or the call waits up to `wait` for every context of it to close (no event
  // says anything) and returns whether they did; a removal that gave up is counted (the
  // kernel's would still be waiting, in D state).
  bool RemoveDevice(const std::string& device, absl::Duration wait);
  // `rdma link add`: a device (a new one, though its name may be an old one's) appears.
  void AddDevice(DeviceConfig config);
  // As loading nvidia_peermem (off at first): from now on ibv_reg_mr of a range that
  // get_user_pages cannot pin asks the process's peer-memory table for its pages, and the
  // HCA moves the range's bytes through the mapping found there.
  void SetPeerMemoryLoaded(bool loaded);

  // --- inspection ---
  // The state of a QP; IBV_QPS_UNKNOWN when there is none.
  ibv_qp_state QpState(uint32_t qpn);
  // The attributes a QP was last moved with (the union of every modify).
  ibv_qp_attr QpAttributes(uint32_t qpn);
  // Send WRs a QP was given: all, signalled, inline.
  struct SendCounts {
    uint64_t posted = 0;
    uint64_t signaled = 0;
    uint64_t inlined = 0;
  };
  SendCounts SendStats(uint32_t qpn);
  // Receives posted on a QP and not yet consumed.
  size_t ReceivesPosted(uint32_t qpn);
  // Contexts, PDs, MRs, CQs and QPs not yet released.
  int LiveObjects();
  uint64_t CqOverruns();
  // Async events raised, handed out and not yet acknowledged, and destroys that gave up
  // waiting for an acknowledgement (a hang on real hardware).
  uint64_t EventsRaised();
  int UnackedEvents();
  uint64_t BlockedDestroys();
  // Device removals that gave up waiting for the device's contexts to close.
  uint64_t BlockedRemovals();
  // Posts refused because inline data would have been read by the CPU from GPU (DMA-BUF or
  // peer) memory: on the hardware, a SIGSEGV in the agent.
  uint64_t CpuFaults();
  // The access flags MR `lkey` was registered with; -1 for none.
  int MrAccess(uint32_t lkey);
  // What a port moved, as the HCA's port counters count it (sysfs
  // /sys/class/infiniband/<device>/ports/<port>/counters/port_xmit_data and port_rcv_data;
  // perfquery's PortXmitData / PortRcvData): a WRITE's payload leaves the requester's port and
  // enters the responder's; a READ's response data leaves the responder's port and enters the
  // requester's. The real counters are in units of 4 octets and also count headers and
  // retransmissions; the model counts the payload octets of WRITE and READ work requests that
  // executed (reached the responder), which is what a provider can say it carried.
  struct PortCounters {
    uint64_t xmit_data = 0;  // payload bytes sent
    uint64_t rcv_data = 0;   // payload bytes received
    uint64_t requests = 0;   // WRITE / READ work requests its QPs executed as the requester
  };
  // All zero for a device or port there is not.
  PortCounters Counters(const std::string& device, uint8_t port = 1);
  // Send work requests on live QPs not yet executed or flushed, plus completions not yet
  // polled: zero once the HCA owes the provider nothing.
  uint64_t WorkOutstanding();
  // Waits until the data mover has nothing runnable.
  void WaitIdle();

 private:
  struct Device;
  struct Context;
  struct Pd;
  struct Mr;
  struct Cq;
  struct Qp;
  struct SendWr;

  bool TakeFault(Call call, int* err) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Qp* FindQp(uint32_t qpn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Qp* QpOf(ibv_qp* qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushCqe(Cq* cq, const ibv_wc& wc, Qp* send_qp, uint64_t send_index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ToError(Qp* qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues an async event on `context` (element: a QP, a CQ or a port number).
  void Raise(Context* context, ibv_event_type type, ibv_qp* qp, ibv_cq* cq, int port)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetPortStateLocked(Device& device, uint8_t port, ibv_port_state state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts `bytes` moved through `port` of `device` (sent or received), and takes the port
  // down when that crosses its SetPortDownAfter mark.
  void CountPort(Device& device, uint8_t port, uint64_t bytes, bool sent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until no handed-out event names `object`; false after the model's patience ran out.
  bool AwaitAcks(const void* object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The wire between `q` and the QP it names: both ready, naming each other, addressed right,
  // both ports up.
  bool Reachable(Qp* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The earliest retry deadline of a QP whose peer does not answer.
  absl::Time NextRetryDeadline() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Flush(Qp* qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int ModifyLocked(Qp* qp, const ibv_qp_attr& attr, int mask) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoseDeviceLocked(Device& device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddDeviceLocked(DeviceConfig config) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when a modify that sets a RoCE path names a destination GID no ACTIVE Ethernet port
  // of the model holds: the kernel's neighbour resolution for it cannot succeed.
  bool NeighbourUnresolvedLocked(Qp* qp, const ibv_qp_attr& attr, int mask)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Executes the head WR of `qp`. False when it must wait (RNR with infinite retry).
  bool Execute(Qp* qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete(Qp* qp, const SendWr& wr, ibv_wc_status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Host memory for [addr, addr+len) of an MR, or null when out of bounds.
  char* Translate(const Mr& mr, uint64_t addr, uint64_t len);
  bool Runnable(Qp* qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyRunnable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Mover();

  absl::Mutex mu_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::map<ibv_context*, std::unique_ptr<Context>> contexts_ ABSL_GUARDED_BY(mu_);
  std::map<ibv_pd*, std::unique_ptr<Pd>> pds_ ABSL_GUARDED_BY(mu_);
  std::map<ibv_mr*, std::unique_ptr<Mr>> mrs_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, Mr*> mrs_by_key_ ABSL_GUARDED_BY(mu_);
  uint64_t cpu_faults_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<ibv_cq*, std::unique_ptr<Cq>> cqs_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::unique_ptr<Qp>> qps_ ABSL_GUARDED_BY(mu_);  // by QPN
  std::map<std::pair<Call, int>, int> faults_ ABSL_GUARDED_BY(mu_);   // (call, err) -> times
  uint32_t next_qpn_ ABSL_GUARDED_BY(mu_) = 0x1000;
  uint32_t next_key_ ABSL_GUARDED_BY(mu_) = 0x2a00;
  uint32_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t cq_overruns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t events_raised_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const void*, int> unacked_ ABSL_GUARDED_BY(mu_);  // handed-out events per object
  uint64_t blocked_destroys_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t blocked_removals_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool peer_memory_loaded_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::thread mover_;
};

}  // namespace ferry::verbs::model
