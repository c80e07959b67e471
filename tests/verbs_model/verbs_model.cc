#include "tests/verbs_model/verbs_model.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "transport/memory/peer_memory.h"

namespace ferry::verbs::model {
namespace {

// fe80::/10: an IPv6 link-local address (RoCE v2 GIDs from the netdev's link-local address).
bool IsLinkLocalGid(const ibv_gid& gid) {
  return gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80;
}

bool IsZeroGid(const ibv_gid& gid) {
  static const ibv_gid kZero = {};
  return std::memcmp(gid.raw, kZero.raw, sizeof(kZero.raw)) == 0;
}

int Fail(int err) {
  errno = err;
  return err;
}

template <typename T>
T* FailNull(int err) {
  errno = err;
  return nullptr;
}

// Whether get_user_pages could pin [addr, addr + len) for `write`: every page mapped,
// readable, and writable when asked (mm/gup.c check_vma_flags refuses with EFAULT a VMA
// without VM_READ, or without VM_WRITE for FOLL_WRITE; ib_umem_get passes no FOLL_FORCE).
// The model reads its own mappings from /proc/self/maps, sorted by address (proc(5)).
bool CpuPagesPinnable(const void* addr, size_t len, bool write) {
  uint64_t next = reinterpret_cast<uint64_t>(addr);
  if (len > ~next) return false;
  const uint64_t end = next + len;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (next < end && std::getline(maps, line)) {
    unsigned long long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %4s", &lo, &hi, perms) != 3) return false;
    if (hi <= next) continue;
    if (lo > next) return false;  // a hole: no pages at all
    if (perms[0] != 'r' || (write && perms[1] != 'w')) return false;
    next = hi;
  }
  return next >= end;
}

ibv_wc_opcode WcOpcodeOf(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
}

// Attribute masks per RC transition, as the IB spec (and every HCA driver) demands them.
struct Transition {
  ibv_qp_state from, to;
  int required, optional;
};
constexpr int kAltEtc = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
const Transition kTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT,
     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_STATE,
     IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
     kAltEtc},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
         IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH |
         IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH |
         IBV_QP_PATH_MIG_STATE},
};

}  // namespace

struct VerbsModel::Device {
  DeviceConfig config;
  ibv_device dev = {};
  bool lost = false;  // LoseDevice(): nothing it had or gets completes
  bool removed = false;  // RemoveDevice(): not listed, not opened
  // Per port (index port - 1): what it moved, and the sent + received total at which
  // SetPortDownAfter takes it down (none: UINT64_MAX).
  std::vector<PortCounters> counters;
  std::vector<uint64_t> down_at;
};
struct VerbsModel::Context {
  ibv_context ctx = {};
  Device* device = nullptr;
  std::deque<ibv_async_event> events;  // raised, not yet handed out
};
struct VerbsModel::Pd {
  ibv_pd pd = {};
  Context* context = nullptr;
};
struct VerbsModel::Mr {
  ibv_mr mr = {};
  Pd* pd = nullptr;
  char* host = nullptr;  // where byte 0 (at `iova`) lives in this process
  // The address the HCA knows byte 0 by: what SGEs and remote accesses use. ibv_reg_mr: the
  // virtual address; ibv_reg_dmabuf_mr: its iova argument, while mr.addr is the dma-buf
  // *offset* (rdma-core libibverbs/verbs.c ibv_reg_dmabuf_mr; ibv_reg_mr(3)).
  uint64_t iova = 0;
  // DMA-BUF or peer memory (a GPU's): the CPU cannot read it, so inline data from it faults.
  bool device_memory = false;
  int access = 0;
  void* mapping = nullptr;  // DMA-BUF registrations: our mmap of the fd
  size_t mapping_len = 0;
  std::shared_ptr<char> peer_pages;  // peer-memory registrations: the pinned pages
};
struct VerbsModel::Cq {
  struct Entry {
    ibv_wc wc;
    bool is_send;
    uint64_t send_index;
  };
  ibv_cq cq = {};
  Context* context = nullptr;
  std::deque<Entry> entries;
  bool error = false;  // overran: takes no more entries
};
struct VerbsModel::SendWr {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  unsigned int flags = 0;
  std::vector<ibv_sge> sges;
  std::string inline_data;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t imm = 0;  // network order, as in ibv_send_wr
  uint64_t index = 0;
};
struct VerbsModel::Qp {
  ibv_qp qp = {};
  Pd* pd = nullptr;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  ibv_qp_cap cap = {};
  bool sig_all = false;
  ibv_qp_attr attr = {};
  std::deque<SendWr> sq;
  std::deque<uint64_t> rq;  // receive wr_ids
  uint64_t posted = 0;      // send WRs ever posted
  uint64_t reclaimed = 0;   // send queue slots given back by polled completions
  uint64_t signaled = 0;
  uint64_t inlined = 0;
  // The head WR's peer does not answer: it fails at `retry_deadline` unless the peer does.
  bool retrying = false;
  absl::Time retry_deadline = absl::InfiniteFuture();
  const PortConfig& port(const Device& device) const {
    return device.config.ports[std::max<int>(attr.port_num, 1) - 1];
  }
};

ibv_gid Ipv4MappedGid(const std::string& ipv4) {
  ibv_gid gid = {};
  gid.raw[10] = 0xff;
  gid.raw[11] = 0xff;
  inet_pton(AF_INET, ipv4.c_str(), gid.raw + 12);
  return gid;
}

DeviceConfig InfinibandDevice(const std::string& name, uint16_t lid) {
  DeviceConfig d;
  d.name = name;
  PortConfig p;
  p.link_layer = IBV_LINK_LAYER_INFINIBAND;
  p.lid = lid;
  ibv_gid_entry e = {};
  e.gid.global.subnet_prefix = htobe64(0xfe80000000000000ull);
  e.gid.global.interface_id = htobe64(0x0002c90300000000ull | lid);
  e.gid_type = IBV_GID_TYPE_IB;
  p.gids = {e};
  d.ports = {p};
  return d;
}

DeviceConfig SoftRoceDevice(const std::string& name, const std::string& ipv4) {
  DeviceConfig d = RoceDevice(name, ipv4);
  d.disassociates = false;  // rxe registers no disassociate_ucontext
  return d;
}

DeviceConfig RoceDevice(const std::string& name, const std::string& ipv4) {
  DeviceConfig d;
  d.name = name;
  PortConfig p;
  p.link_layer = IBV_LINK_LAYER_ETHERNET;
  p.lid = 0;
  p.active_mtu = IBV_MTU_1024;  // a 1500-byte Ethernet MTU
  ibv_gid link_local = {};
  link_local.global.subnet_prefix = htobe64(0xfe80000000000000ull);
  link_local.global.interface_id = htobe64(0x020c29fffe000001ull);
  ibv_gid mapped = Ipv4MappedGid(ipv4);
  auto entry = [](ibv_gid gid, uint32_t index, uint32_t type) {
    ibv_gid_entry e = {};
    e.gid = gid;
    e.gid_index = index;
    e.port_num = 1;
    e.gid_type = type;
    return e;
  };
  p.gids = {entry(link_local, 0, IBV_GID_TYPE_ROCE_V1), entry(link_local, 1, IBV_GID_TYPE_ROCE_V2),
            entry(mapped, 2, IBV_GID_TYPE_ROCE_V1), entry(mapped, 3, IBV_GID_TYPE_ROCE_V2)};
  d.ports = {p};
  return d;
}

VerbsModel::VerbsModel(std::vector<DeviceConfig> devices) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& config : devices) AddDeviceLocked(std::move(config));
  }
  mover_ = std::thread([this] { Mover(); });
}

void VerbsModel::AddDeviceLocked(DeviceConfig config) {
  auto d = std::make_unique<Device>();
  d->config = std::move(config);
  d->counters.resize(d->config.ports.size());
  d->down_at.assign(d->config.ports.size(), UINT64_MAX);
  d->dev.node_type = IBV_NODE_CA;
  d->dev.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(d->dev.name, sizeof(d->dev.name), "%s", d->config.name.c_str());
  std::snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%zu", devices_.size());
  devices_.push_back(std::move(d));
}

void VerbsModel::AddDevice(DeviceConfig config) {
  absl::MutexLock lock(&mu_);
  AddDeviceLocked(std::move(config));
}

bool VerbsModel::RemoveDevice(const std::string& device, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  Device* d = nullptr;
  for (auto& candidate : devices_) {
    if (candidate->config.name == device && !candidate->removed) d = candidate.get();
  }
  if (d == nullptr) return false;
  d->removed = true;
  if (d->config.disassociates) {
    LoseDeviceLocked(*d);
    return true;
  }
  auto closed = [this, d]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (const auto& [handle, c] : contexts_) {
      if (c->device == d) return false;
    }
    return true;
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&closed), wait)) return true;
  ++blocked_removals_;
  return false;
}

uint64_t VerbsModel::BlockedRemovals() {
  absl::MutexLock lock(&mu_);
  return blocked_removals_;
}

VerbsModel::~VerbsModel() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  mover_.join();
  for (auto& [mr, m] : mrs_) {
    if (m->mapping != nullptr) munmap(m->mapping, m->mapping_len);
  }
}

bool VerbsModel::TakeFault(Call call, int* err) {
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (it->first.first != call) continue;
    *err = it->first.second;
    if (--it->second == 0) faults_.erase(it);
    return true;
  }
  return false;
}

void VerbsModel::FailNext(Call call, int err, int times) {
  absl::MutexLock lock(&mu_);
  faults_[{call, err}] += times;
}

// ---------------------------------------------------------------- devices and queries

ibv_device** VerbsModel::GetDeviceList(int* num) {
  absl::MutexLock lock(&mu_);
  int err = 0;
  if (TakeFault(Call::kGetDeviceList, &err)) return FailNull<ibv_device*>(err);
  // What rdma-core answers on a kernel without RDMA support.
  if (devices_.empty()) return FailNull<ibv_device*>(ENOSYS);
  // With RDMA support but every device removed, an empty list.
  auto** list = new ibv_device*[devices_.size() + 1];
  size_t listed = 0;
  for (const auto& d : devices_) {
    if (!d->removed) list[listed++] = &d->dev;
  }
  list[listed] = nullptr;
  if (num != nullptr) *num = static_cast<int>(listed);
  return list;
}

void VerbsModel::FreeDeviceList(ibv_device** list) { delete[] list; }

const char* VerbsModel::GetDeviceName(ibv_device* device) { return device->name; }

ibv_context* VerbsModel::OpenDevice(ibv_device* device) {
  absl::MutexLock lock(&mu_);
  int err = 0;
  if (TakeFault(Call::kOpenDevice, &err)) return FailNull<ibv_context>(err);
  for (auto& d : devices_) {
    if (&d->dev != device) continue;
    if (d->removed) break;  // its uverbs cdev is gone
    // A device that raised DEVICE_FATAL takes no new context until its driver re-adds it (a
    // new device, AddDevice): mlx5 in its internal-error state fails the commands a new
    // ucontext needs. The model answers EIO, so a holder that closed a fatal device cannot
    // take the dead one back for a live one.
    if (d->lost) return FailNull<ibv_context>(EIO);
    auto c = std::make_unique<Context>();
    c->device = d.get();
    c->ctx.device = device;
    c->ctx.cmd_fd = -1;
    // A real fd, so that poll() and fcntl(O_NONBLOCK) work on it as on rdma-core's; one
    // count per pending event (EFD_SEMAPHORE).
    c->ctx.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (c->ctx.async_fd < 0) return nullptr;
    c->ctx.num_comp_vectors = 1;
    ibv_context* handle = &c->ctx;
    contexts_[handle] = std::move(c);
    return handle;
  }
  return FailNull<ibv_context>(ENODEV);
}

int VerbsModel::CloseDevice(ibv_context* context) {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(context);
  if (it == contexts_.end()) return Fail(EINVAL);
  // A real close would leak these; the model refuses so that tests see the wrong order.
  for (auto& [p, pd] : pds_) {
    if (pd->context == it->second.get()) return Fail(EBUSY);
  }
  for (auto& [c, cq] : cqs_) {
    if (cq->context == it->second.get()) return Fail(EBUSY);
  }
  if (!AwaitAcks(nullptr)) return Fail(EBUSY);
  close(context->async_fd);
  contexts_.erase(it);
  return 0;
}

bool VerbsModel::DeviceRemoved(ibv_context* context) {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(context);
  return it != contexts_.end() && it->second->device->removed;
}

int VerbsModel::QueryDevice(ibv_context* context, ibv_device_attr* attr) {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(context);
  if (it == contexts_.end()) return Fail(EINVAL);
  const DeviceConfig& c = it->second->device->config;
  *attr = {};
  std::snprintf(attr->fw_ver, sizeof(attr->fw_ver), "ferry-verbs-model");
  attr->phys_port_cnt = static_cast<uint8_t>(c.ports.size());
  attr->max_qp = 1 << 17;
  attr->max_qp_wr = c.max_qp_wr;
  attr->max_sge = c.max_sge;
  attr->max_cq = c.max_cq;
  attr->max_cqe = c.max_cqe;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_mr_size = UINT64_MAX;
  attr->max_qp_rd_atom = c.max_qp_rd_atom;
  attr->max_qp_init_rd_atom = c.max_qp_init_rd_atom;
  return 0;
}

int VerbsModel::QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(context);
  if (it == contexts_.end()) return Fail(EINVAL);
  const DeviceConfig& c = it->second->device->config;
  if (port < 1 || port > c.ports.size()) return Fail(EINVAL);
  const PortConfig& p = c.ports[port - 1];
  *attr = {};
  attr->state = p.state;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = p.active_mtu;
  attr->gid_tbl_len = static_cast<int>(p.gids.size());
  attr->max_msg_sz = p.max_msg_sz;
  attr->lid = p.lid;
  attr->link_layer = p.link_layer;
  attr->flags = p.flags;
  attr->pkey_tbl_len = p.pkey_tbl_len;
  attr->phys_state = p.state == IBV_PORT_ACTIVE ? 5 : 3;  // LinkUp : Disabled
  return 0;
}

int VerbsModel::QueryGidEx(ibv_context* context, uint32_t port, uint32_t index,
                           ibv_gid_entry* entry) {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(context);
  if (it == contexts_.end()) return Fail(EINVAL);
  const DeviceConfig& c = it->second->device->config;
  if (port < 1 || port > c.ports.size()) return Fail(EINVAL);
  const PortConfig& p = c.ports[port - 1];
  if (index >= p.gids.size()) return Fail(EINVAL);
  if (IsZeroGid(p.gids[index].gid)) return Fail(ENODATA);
  *entry = p.gids[index];
  entry->gid_index = index;
  entry->port_num = port;
  return 0;
}

// ---------------------------------------------------------------- PD, MR, CQ

ibv_pd* VerbsModel::AllocPd(ibv_context* context) {
  absl::MutexLock lock(&mu_);
  int err = 0;
  if (TakeFault(Call::kAllocPd, &err)) return FailNull<ibv_pd>(err);
  auto it = contexts_.find(context);
  if (it == contexts_.end()) return FailNull<ibv_pd>(EINVAL);
  auto p = std::make_unique<Pd>();
  p->context = it->second.get();
  p->pd.context = context;
  p->pd.handle = next_handle_++;
  ibv_pd* handle = &p->pd;
  pds_[handle] = std::move(p);
  return handle;
}

int VerbsModel::DeallocPd(ibv_pd* pd) {
  absl::MutexLock lock(&mu_);
  auto it = pds_.find(pd);
  if (it == pds_.end()) return Fail(EINVAL);
  for (auto& [m, mr] : mrs_) {
    if (mr->pd == it->second.get()) return Fail(EBUSY);
  }
  for (auto& [n, qp] : qps_) {
    if (qp->pd == it->second.get()) return Fail(EBUSY);
  }
  pds_.erase(it);
  return 0;
}

ibv_mr* VerbsModel::RegMr(ibv_pd* pd, void* addr, size_t length, int access) {
  absl::MutexLock lock(&mu_);
  int err = 0;
  if (TakeFault(Call::kRegMr, &err)) return FailNull<ibv_mr>(err);
  auto it = pds_.find(pd);
  if (it == pds_.end() || addr == nullptr || length == 0) return FailNull<ibv_mr>(EINVAL);
  // Access bits the model does not know are refused (EINVAL), except optional ones, which
  // rdma-core drops where unsupported (verbs.h IBV_ACCESS_OPTIONAL_RANGE, ibv_reg_mr(3)).
  constexpr int kKnown = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                         IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  if ((access & ~(kKnown | IBV_ACCESS_OPTIONAL_RANGE)) != 0) return FailNull<ibv_mr>(EINVAL);
  // Remote write without local write is refused by every HCA.
  if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    return FailNull<ibv_mr>(EINVAL);
  }
  // ib_umem_get: a peer-memory client that claims the range (nvidia_peermem, for a
  // cudaMalloc pointer) pins its pages; anything else must be CPU pages get_user_pages can
  // pin, written to when the MR is writable (ib_access_writable), or the call fails EFAULT.
  std::shared_ptr<char> peer_pages;
  if (peer_memory_loaded_) peer_pages = memory::PeerMemory().Find(addr, length);
  constexpr int kWritable =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  if (peer_pages == nullptr && !CpuPagesPinnable(addr, length, (access & kWritable) != 0)) {
    return FailNull<ibv_mr>(EFAULT);
  }
  auto m = std::make_unique<Mr>();
  m->pd = it->second.get();
  m->host = peer_pages != nullptr ? peer_pages.get() : static_cast<char*>(addr);
  m->device_memory = peer_pages != nullptr;
  m->peer_pages = std::move(peer_pages);
  m->access = access;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->iova = reinterpret_cast<uint64_t>(addr);
  m->mr.length = length;
  m->mr.handle = next_handle_++;
  m->mr.lkey = m->mr.rkey = next_key_;
  next_key_ += 0x100;  // like mlx5: the low byte is a variant, keys step by 256
  ibv_mr* handle = &m->mr;
  mrs_by_key_[m->mr.lkey] = m.get();
  mrs_[handle] = std::move(m);
  return handle;
}

ibv_mr* VerbsModel::RegDmabufMr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova,
                                int fd, int access) {
  absl::MutexLock lock(&mu_);
  int err = 0;
  if (TakeFault(Call::kRegDmabufMr, &err)) return FailNull<ibv_mr>(err);
  auto it = pds_.find(pd);
  if (it == pds_.end() || length == 0) return FailNull<ibv_mr>(EINVAL);
  if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    return FailNull<ibv_mr>(EINVAL);
  }
  // The "HCA" reaches the DMA-BUF's pages by mapping the fd (a memfd in tests).
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  // The kernel maps iova onto the dma-buf's pages page by page (ib_umem_dmabuf_get,
  // ib_umem_find_best_pgsz): an iova whose offset within a page differs from the dma-buf
  // offset's cannot be mapped.
  if (iova % page != offset % page) return FailNull<ibv_mr>(EINVAL);
  const uint64_t aligned = offset / page * page;
  const size_t map_len = length + (offset - aligned);
  void* map = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                   static_cast<off_t>(aligned));
  if (map == MAP_FAILED) return nullptr;  // errno from mmap: EBADF, EINVAL, ...
  auto m = std::make_unique<Mr>();
  m->pd = it->second.get();
  m->host = static_cast<char*>(map) + (offset - aligned);
  m->access = access;
  m->mapping = map;
  m->mapping_len = map_len;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  // rdma-core sets addr to the offset, not the iova (libibverbs/verbs.c): code that takes
  // mr->addr as the region's address gets the wrong one, as it would on the hardware.
  m->mr.addr = reinterpret_cast<void*>(offset);
  m->iova = iova;
  m->device_memory = true;
  m->mr.length = length;
  m->mr.handle = next_handle_++;
  m->mr.lkey = m->mr.rkey = next_key_;
  next_key_ += 0x100;
  ibv_mr* handle = &m->mr;
  mrs_by_key_[m->mr.lkey] = m.get();
  mrs_[handle] = std::move(m);
  return handle;
}

int VerbsModel::DeregMr(ibv_mr* mr) {
  absl::MutexLock lock(&mu_);
  auto it = mrs_.find(mr);
  if (it == mrs_.end()) return Fail(EINVAL);
  mrs_by_key_.erase(mr->lkey);
  if (it->second->mapping != nullptr) munmap(it->second->mapping, it->second->mapping_len);
  mrs_.erase(it);
  return 0;
}

ibv_cq* VerbsModel::CreateCq(ibv_context* context, int cqe) {
  absl::MutexLock lock(&mu_);
  int err = 0;
  if (TakeFault(Call::kCreateCq, &err)) return FailNull<ibv_cq>(err);
  auto it = contexts_.find(context);
  if (it == contexts_.end() || cqe < 1 || cqe > it->second->device->config.max_cqe) {
    return FailNull<ibv_cq>(EINVAL);
  }
  auto c = std::make_unique<Cq>();
  c->context = it->second.get();
  c->cq.context = context;
  c->cq.cqe = cqe;
  c->cq.handle = next_handle_++;
  ibv_cq* handle = &c->cq;
  cqs_[handle] = std::move(c);
  return handle;
}

int VerbsModel::DestroyCq(ibv_cq* cq) {
  absl::MutexLock lock(&mu_);
  auto it = cqs_.find(cq);
  if (it == cqs_.end()) return Fail(EINVAL);
  for (auto& [n, qp] : qps_) {
    if (qp->send_cq == it->second.get() || qp->recv_cq == it->second.get()) return Fail(EBUSY);
  }
  if (!AwaitAcks(cq)) return Fail(EBUSY);
  // Events not yet handed out die with their object (the kernel drops them on destroy).
  std::erase_if(it->second->context->events,
                [cq](const ibv_async_event& e) { return e.element.cq == cq; });
  cqs_.erase(it);
  return 0;
}

void VerbsModel::PushCqe(Cq* cq, const ibv_wc& wc, Qp* send_qp, uint64_t send_index) {
  if (cq->context->device->lost) return;  // a dead device writes nothing
  if (!cq->error && cq->entries.size() >= static_cast<size_t>(cq->cq.cqe)) {
    // A CQ overrun: the CQ enters the error state and an affiliated IBV_EVENT_CQ_ERR is
    // raised ("CQ is in error (CQ overrun)", ibv_get_async_event(3)); the entry is lost.
    ++cq_overruns_;
    cq->error = true;
    Raise(cq->context, IBV_EVENT_CQ_ERR, nullptr, &cq->cq, 0);
  }
  if (cq->error) {
    // A QP completing into an errored CQ goes to ERR; its completions are lost with it.
    if (Qp* q = FindQp(wc.qp_num); q != nullptr && q->qp.state != IBV_QPS_ERR) {
      q->qp.state = IBV_QPS_ERR;
      q->attr.qp_state = IBV_QPS_ERR;
    }
    return;
  }
  cq->entries.push_back({wc, send_qp != nullptr, send_index});
}

int VerbsModel::PollCq(ibv_cq* cq, int num, ibv_wc* wc) {
  absl::MutexLock lock(&mu_);
  int err = 0;
  if (TakeFault(Call::kPollCq, &err)) return -err;
  auto it = cqs_.find(cq);
  if (it == cqs_.end()) return -EINVAL;
  int n = 0;
  auto& entries = it->second->entries;
  while (n < num && !entries.empty()) {
    const Cq::Entry& e = entries.front();
    wc[n++] = e.wc;
    if (e.is_send) {
      // The send queue slots of this WR and every unsignalled one before it come back only
      // now, as in the user-space drivers.
      if (Qp* qp = FindQp(e.wc.qp_num)) qp->reclaimed = std::max(qp->reclaimed, e.send_index + 1);
    }
    entries.pop_front();
  }
  return n;
}

// ---------------------------------------------------------------- QPs

VerbsModel::Qp* VerbsModel::FindQp(uint32_t qpn) {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? nullptr : it->second.get();
}

VerbsModel::Qp* VerbsModel::QpOf(ibv_qp* qp) {
  if (qp == nullptr) return nullptr;
  Qp* q = FindQp(qp->qp_num);
  return q != nullptr && &q->qp == qp ? q : nullptr;
}

ibv_qp* VerbsModel::CreateQp(ibv_pd* pd, ibv_qp_init_attr* init) {
  absl::MutexLock lock(&mu_);
  int err = 0;
  if (TakeFault(Call::kCreateQp, &err)) return FailNull<ibv_qp>(err);
  auto pit = pds_.find(pd);
  if (pit == pds_.end() || init == nullptr) return FailNull<ibv_qp>(EINVAL);
  if (init->qp_type != IBV_QPT_RC || init->srq != nullptr) return FailNull<ibv_qp>(EOPNOTSUPP);
  auto scq = cqs_.find(init->send_cq);
  auto rcq = cqs_.find(init->recv_cq);
  if (scq == cqs_.end() || rcq == cqs_.end()) return FailNull<ibv_qp>(EINVAL);
  const DeviceConfig& dev = pit->second->context->device->config;
  const ibv_qp_cap& cap = init->cap;
  if (cap.max_send_wr > static_cast<uint32_t>(dev.max_qp_wr) ||
      cap.max_recv_wr > static_cast<uint32_t>(dev.max_qp_wr) ||
      cap.max_send_sge > static_cast<uint32_t>(dev.max_sge) ||
      cap.max_recv_sge > static_cast<uint32_t>(dev.max_sge) ||
      cap.max_inline_data > dev.max_inline_data) {
    return FailNull<ibv_qp>(EINVAL);
  }
  auto q = std::make_unique<Qp>();
  q->pd = pit->second.get();
  q->send_cq = scq->second.get();
  q->recv_cq = rcq->second.get();
  q->cap = cap;
  q->sig_all = init->sq_sig_all != 0;
  q->qp.context = pd->context;
  q->qp.pd = pd;
  q->qp.send_cq = init->send_cq;
  q->qp.recv_cq = init->recv_cq;
  q->qp.handle = next_handle_++;
  q->qp.qp_num = next_qpn_++;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = IBV_QPT_RC;
  ibv_qp* handle = &q->qp;
  qps_[q->qp.qp_num] = std::move(q);
  return handle;
}

int VerbsModel::DestroyQp(ibv_qp* qp) {
  absl::MutexLock lock(&mu_);
  Qp* q = QpOf(qp);
  if (q == nullptr) return Fail(EINVAL);
  if (!AwaitAcks(qp)) return Fail(EBUSY);
  q = QpOf(qp);  // the wait let other threads in
  if (q == nullptr) return Fail(EINVAL);
  std::erase_if(q->pd->context->events,
                [qp](const ibv_async_event& e) { return e.element.qp == qp; });
  // Like the drivers: completions of a destroyed QP are purged from its CQs.
  for (Cq* cq : {q->send_cq, q->recv_cq}) {
    std::erase_if(cq->entries, [&](const Cq::Entry& e) { return e.wc.qp_num == qp->qp_num; });
  }
  qps_.erase(qp->qp_num);
  return 0;
}

int VerbsModel::ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  {
    absl::MutexLock lock(&mu_);
    int err = 0;
    if (TakeFault(Call::kModifyQp, &err)) return Fail(err);
    Qp* q = QpOf(qp);
    if (q == nullptr || attr == nullptr) return Fail(EINVAL);
    if (!NeighbourUnresolvedLocked(q, *attr, mask)) return ModifyLocked(q, *attr, mask);
  }
  // The kernel resolves the MAC before the driver sees the modify, and waits for it with
  // nothing else held: the QP stays as it was.
  absl::SleepFor(kNeighbourTimeout);
  return Fail(ETIMEDOUT);
}

bool VerbsModel::NeighbourUnresolvedLocked(Qp* q, const ibv_qp_attr& a, int mask) {
  if (!(mask & IBV_QP_AV) || !a.ah_attr.is_global) return false;
  const DeviceConfig& dc = q->pd->context->device->config;
  const int port_num = mask & IBV_QP_PORT ? a.port_num : q->attr.port_num;
  if (port_num < 1 || port_num > static_cast<int>(dc.ports.size()) ||
      dc.ports[port_num - 1].link_layer != IBV_LINK_LAYER_ETHERNET) {
    return false;  // InfiniBand routes by LID; a bad port is ModifyLocked's EINVAL
  }
  const ibv_gid& dgid = a.ah_attr.grh.dgid;
  if (IsLinkLocalGid(dgid) || IsZeroGid(dgid)) return false;
  for (const auto& device : devices_) {
    if (device->lost || device->removed) continue;
    for (const PortConfig& port : device->config.ports) {
      if (port.link_layer != IBV_LINK_LAYER_ETHERNET || port.state != IBV_PORT_ACTIVE) continue;
      for (const ibv_gid_entry& entry : port.gids) {
        if (std::memcmp(entry.gid.raw, dgid.raw, sizeof(dgid.raw)) == 0) return false;
      }
    }
  }
  return true;
}

int VerbsModel::ModifyLocked(Qp* q, const ibv_qp_attr& a, int mask) {
  if (!(mask & IBV_QP_STATE)) return Fail(EINVAL);
  const ibv_qp_state from = q->qp.state;
  if ((mask & IBV_QP_CUR_STATE) && a.cur_qp_state != from) return Fail(EINVAL);
  if (a.qp_state == IBV_QPS_RESET) {
    q->sq.clear();
    q->rq.clear();
    q->reclaimed = q->posted;
    q->attr = {};
    q->qp.state = IBV_QPS_RESET;
    return 0;
  }
  if (a.qp_state == IBV_QPS_ERR) {
    ToError(q);
    return 0;
  }
  const Transition* t = nullptr;
  for (const Transition& candidate : kTransitions) {
    if (candidate.from == from && candidate.to == a.qp_state) t = &candidate;
  }
  if (t == nullptr) return Fail(EINVAL);
  if ((mask & t->required) != t->required || (mask & ~(t->required | t->optional)) != 0) {
    return Fail(EINVAL);
  }
  const Device& dev = *q->pd->context->device;
  const DeviceConfig& dc = dev.config;
  if (mask & IBV_QP_PORT) {
    if (a.port_num < 1 || a.port_num > dc.ports.size()) return Fail(EINVAL);
  }
  const PortConfig& port =
      dc.ports[std::max<int>(mask & IBV_QP_PORT ? a.port_num : q->attr.port_num, 1) - 1];
  if (mask & IBV_QP_PATH_MTU) {
    if (a.path_mtu < IBV_MTU_256 || a.path_mtu > port.active_mtu) return Fail(EINVAL);
  }
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = a.ah_attr;
    if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
      // RoCE has no LIDs: the GRH (and a valid source GID) is mandatory.
      if (!ah.is_global || ah.grh.sgid_index >= port.gids.size() ||
          IsZeroGid(port.gids[ah.grh.sgid_index].gid)) {
        return Fail(EINVAL);
      }
    } else if (!ah.is_global && ah.dlid == 0) {
      return Fail(EINVAL);
    } else if ((port.flags & IBV_QPF_GRH_REQUIRED) && !ah.is_global) {
      // The kernel refuses an address handle without a GRH on such a port (ib_core
      // rdma_check_ah_attr / ib_resolve_eth_dmac path: -EINVAL).
      return Fail(EINVAL);
    }
    if (ah.is_global && IsLinkLocalGid(ah.grh.dgid) && port.link_layer == IBV_LINK_LAYER_ETHERNET &&
        port.gids.size() > ah.grh.sgid_index && !IsLinkLocalGid(port.gids[ah.grh.sgid_index].gid)) {
      // A routable source addressing a link-local peer: RoCE v2 packets to fe80:: are not
      // routed off the link; the model refuses the path rather than let it look fine.
      return Fail(EINVAL);
    }
  }
  if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index >= port.pkey_tbl_len) return Fail(EINVAL);
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > dc.max_qp_rd_atom) {
    return Fail(EINVAL);
  }
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > dc.max_qp_init_rd_atom) {
    return Fail(EINVAL);
  }
  if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return Fail(EINVAL);
  if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return Fail(EINVAL);
  if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return Fail(EINVAL);
  if ((mask & IBV_QP_DEST_QPN) && (a.dest_qp_num == 0 || a.dest_qp_num > 0xffffff)) {
    return Fail(EINVAL);
  }
  if ((mask & IBV_QP_RQ_PSN) && a.rq_psn > 0xffffff) return Fail(EINVAL);
  if ((mask & IBV_QP_SQ_PSN) && a.sq_psn > 0xffffff) return Fail(EINVAL);

  ibv_qp_attr& s = q->attr;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = a.pkey_index;
  if (mask & IBV_QP_PORT) s.port_num = a.port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) s.qp_access_flags = a.qp_access_flags;
  if (mask & IBV_QP_AV) s.ah_attr = a.ah_attr;
  if (mask & IBV_QP_PATH_MTU) s.path_mtu = a.path_mtu;
  if (mask & IBV_QP_DEST_QPN) s.dest_qp_num = a.dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) s.rq_psn = a.rq_psn;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s.min_rnr_timer = a.min_rnr_timer;
  if (mask & IBV_QP_SQ_PSN) s.sq_psn = a.sq_psn;
  if (mask & IBV_QP_TIMEOUT) s.timeout = a.timeout;
  if (mask & IBV_QP_RETRY_CNT) s.retry_cnt = a.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s.rnr_retry = a.rnr_retry;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = a.max_rd_atomic;
  s.qp_state = a.qp_state;
  q->qp.state = a.qp_state;
  return 0;
}

void VerbsModel::ToError(Qp* q) {
  q->qp.state = IBV_QPS_ERR;
  q->attr.qp_state = IBV_QPS_ERR;
  Flush(q);
}

void VerbsModel::Flush(Qp* q) {
  while (!q->sq.empty()) {
    Complete(q, q->sq.front(), IBV_WC_WR_FLUSH_ERR);
    q->sq.pop_front();
  }
  for (uint64_t wr_id : q->rq) {
    ibv_wc wc = {};
    wc.wr_id = wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = q->qp.qp_num;
    PushCqe(q->recv_cq, wc, nullptr, 0);
  }
  q->rq.clear();
}

void VerbsModel::Complete(Qp* q, const SendWr& wr, ibv_wc_status status) {
  // Errors always complete; successes only when signalled.
  if (status == IBV_WC_SUCCESS && !(wr.flags & IBV_SEND_SIGNALED) && !q->sig_all) return;
  ibv_wc wc = {};
  wc.wr_id = wr.wr_id;
  wc.status = status;
  wc.opcode = WcOpcodeOf(wr.opcode);
  wc.qp_num = q->qp.qp_num;
  if (status == IBV_WC_SUCCESS && wr.opcode == IBV_WR_RDMA_READ) {
    uint64_t total = 0;
    for (const auto& sge : wr.sges) total += sge.length;
    wc.byte_len = static_cast<uint32_t>(total);
  }
  PushCqe(q->send_cq, wc, q, wr.index);
}

int VerbsModel::PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  absl::MutexLock lock(&mu_);
  Qp* q = QpOf(qp);
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
    int err = 0;
    uint64_t total = 0;
    for (int i = 0; i < w->num_sge; ++i) total += w->sg_list[i].length;
    if (q == nullptr) {
      err = EINVAL;
    } else if (TakeFault(Call::kPostSend, &err)) {
    } else if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR) {
      err = EINVAL;
    } else if (w->opcode != IBV_WR_RDMA_WRITE && w->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
               w->opcode != IBV_WR_RDMA_READ) {
      err = EINVAL;
    } else if (w->num_sge < 0 || static_cast<uint32_t>(w->num_sge) > q->cap.max_send_sge) {
      err = EINVAL;
    } else if (q->posted - q->reclaimed >= q->cap.max_send_wr) {
      err = ENOMEM;
    } else if ((w->send_flags & IBV_SEND_INLINE) &&
               (w->opcode == IBV_WR_RDMA_READ || total > q->cap.max_inline_data)) {
      err = EINVAL;
    }
    if (err != 0) {
      if (bad_wr != nullptr) *bad_wr = w;
      return Fail(err);
    }
    SendWr s;
    s.wr_id = w->wr_id;
    s.opcode = w->opcode;
    s.flags = w->send_flags;
    s.remote_addr = w->wr.rdma.remote_addr;
    s.rkey = w->wr.rdma.rkey;
    s.imm = w->imm_data;
    s.index = q->posted++;
    q->signaled += (w->send_flags & IBV_SEND_SIGNALED) != 0;
    q->inlined += (w->send_flags & IBV_SEND_INLINE) != 0;
    if (w->send_flags & IBV_SEND_INLINE) {
      // Inline data is copied at post time by the CPU from the SGE address, with no lkey
      // check (libmlx5 mlx5_post_send -> set_data_inl_seg: memcpy). From GPU memory that
      // is a SIGSEGV in the caller; the model refuses it loudly instead of crashing.
      for (int i = 0; i < w->num_sge; ++i) {
        auto mit = mrs_by_key_.find(w->sg_list[i].lkey);
        if (mit != mrs_by_key_.end() && mit->second->device_memory) {
          ++cpu_faults_;
          if (bad_wr != nullptr) *bad_wr = w;
          return Fail(EFAULT);
        }
      }
      for (int i = 0; i < w->num_sge; ++i) {
        s.inline_data.append(reinterpret_cast<const char*>(w->sg_list[i].addr),
                             w->sg_list[i].length);
      }
    } else {
      s.sges.assign(w->sg_list, w->sg_list + w->num_sge);
    }
    if (q->qp.state == IBV_QPS_ERR) {
      Complete(q, s, IBV_WC_WR_FLUSH_ERR);
    } else {
      q->sq.push_back(std::move(s));
    }
  }
  return 0;
}

int VerbsModel::PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  absl::MutexLock lock(&mu_);
  Qp* q = QpOf(qp);
  for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
    int err = 0;
    if (q == nullptr || q->qp.state == IBV_QPS_RESET) {
      err = EINVAL;
    } else if (TakeFault(Call::kPostRecv, &err)) {
    } else if (w->num_sge < 0 || static_cast<uint32_t>(w->num_sge) > q->cap.max_recv_sge) {
      err = EINVAL;
    } else if (q->rq.size() >= q->cap.max_recv_wr) {
      err = ENOMEM;
    }
    if (err != 0) {
      if (bad_wr != nullptr) *bad_wr = w;
      return Fail(err);
    }
    q->rq.push_back(w->wr_id);
    if (q->qp.state == IBV_QPS_ERR) Flush(q);
  }
  return 0;
}

// ---------------------------------------------------------------- the data mover

char* VerbsModel::Translate(const Mr& mr, uint64_t addr, uint64_t len) {
  const uint64_t base = mr.iova;
  if (addr < base || len > mr.mr.length || addr - base > mr.mr.length - len) return nullptr;
  return mr.host + (addr - base);
}

namespace {

bool SameGid(const ibv_gid& a, const ibv_gid& b) { return std::memcmp(a.raw, b.raw, 16) == 0; }

}  // namespace

bool VerbsModel::Reachable(Qp* q) {
  // The peer must exist, be at least RTR, name us back, be addressed correctly, expect our
  // PSN, and both ports must be up. Otherwise no ACK ever comes.
  const Device& dev = *q->pd->context->device;
  const PortConfig& port = q->port(dev);
  Qp* peer = FindQp(q->attr.dest_qp_num);
  if (peer == nullptr || dev.lost || peer->pd->context->device->lost) return false;
  if (!(peer->qp.state == IBV_QPS_RTR || peer->qp.state == IBV_QPS_RTS) ||
      peer->attr.dest_qp_num != q->qp.qp_num || peer->attr.rq_psn != q->attr.sq_psn ||
      peer->attr.path_mtu != q->attr.path_mtu) {
    return false;
  }
  const PortConfig& peer_port = peer->port(*peer->pd->context->device);
  if (port.state != IBV_PORT_ACTIVE || peer_port.state != IBV_PORT_ACTIVE) return false;
  const ibv_ah_attr& ah = q->attr.ah_attr;
  if (peer_port.link_layer != port.link_layer) return false;
  if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
    const ibv_gid_entry& ours = port.gids[ah.grh.sgid_index];
    const ibv_gid_entry& theirs = peer_port.gids[peer->attr.ah_attr.grh.sgid_index];
    return SameGid(ah.grh.dgid, theirs.gid) && ours.gid_type == theirs.gid_type;
  }
  return ah.dlid == peer_port.lid;
}

absl::Time VerbsModel::NextRetryDeadline() {
  absl::Time next = absl::InfiniteFuture();
  for (auto& [qpn, q] : qps_) {
    if (q->retrying && !q->sq.empty() && q->qp.state == IBV_QPS_RTS) {
      next = std::min(next, q->retry_deadline);
    }
  }
  return next;
}

bool VerbsModel::Runnable(Qp* q) {
  if (q->sq.empty() || q->qp.state != IBV_QPS_RTS) return false;
  if (q->retrying) return absl::Now() >= q->retry_deadline || Reachable(q);
  const SendWr& head = q->sq.front();
  if (head.opcode != IBV_WR_RDMA_WRITE_WITH_IMM || q->attr.rnr_retry != 7) return true;
  // RNR with infinite retry: wait for the peer to post a receive.
  Qp* peer = FindQp(q->attr.dest_qp_num);
  return peer == nullptr || !peer->rq.empty() || peer->qp.state == IBV_QPS_ERR;
}

bool VerbsModel::AnyRunnable() {
  for (auto& [qpn, q] : qps_) {
    if (Runnable(q.get())) return true;
  }
  return false;
}

bool VerbsModel::Execute(Qp* q) {
  const SendWr wr = q->sq.front();
  auto fail = [&](ibv_wc_status status) {
    q->sq.pop_front();
    Complete(q, wr, status);
    ToError(q);  // flushes the rest
    return true;
  };
  const Device& dev = *q->pd->context->device;
  const PortConfig& port = q->port(dev);
  uint64_t total = wr.inline_data.size();
  for (const auto& sge : wr.sges) total += sge.length;
  if (total > port.max_msg_sz) return fail(IBV_WC_LOC_LEN_ERR);

  // Local side: every sge must lie in an MR of this QP's PD (READ needs LOCAL_WRITE).
  std::vector<char*> local;
  for (const auto& sge : wr.sges) {
    auto it = mrs_by_key_.find(sge.lkey);
    Mr* mr = it == mrs_by_key_.end() ? nullptr : it->second;
    char* p = mr != nullptr && mr->pd == q->pd ? Translate(*mr, sge.addr, sge.length) : nullptr;
    if (p == nullptr) return fail(IBV_WC_LOC_PROT_ERR);
    if (wr.opcode == IBV_WR_RDMA_READ && !(mr->access & IBV_ACCESS_LOCAL_WRITE)) {
      return fail(IBV_WC_LOC_PROT_ERR);
    }
    local.push_back(p);
  }

  if (!Reachable(q)) {
    // No ACK comes: the requester retransmits retry_cnt times, each after the local ACK
    // timeout of 4.096 us x 2^timeout (ibv_modify_qp(3): IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT),
    // then fails the WR; a timeout of 0 means wait forever. retry_cnt 7 also means forever,
    // as the kernel's Soft-RoCE takes it (drivers/infiniband/sw/rxe/rxe_comp.c,
    // rxe_completer: `if (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--;`), seen in a QEMU
    // guest: a provider asking for 7 hung on a dead peer there. mlx5 counts 7 retries; the
    // model is the stricter of the two.
    if (!q->retrying) {
      q->retrying = true;
      const double seconds = (q->attr.retry_cnt + 1) * 4.096e-6 * std::ldexp(1.0, q->attr.timeout);
      q->retry_deadline = q->attr.timeout == 0 || q->attr.retry_cnt == 7
                              ? absl::InfiniteFuture()
                              : absl::Now() + absl::Seconds(seconds);
    }
    if (absl::Now() < q->retry_deadline) return false;
    q->retrying = false;
    return fail(IBV_WC_RETRY_EXC_ERR);
  }
  q->retrying = false;
  Qp* peer = FindQp(q->attr.dest_qp_num);

  // The responder's checks: rkey in the responder QP's PD, range, and access rights of both
  // the MR and the QP. A refusal touches nothing.
  const int need = wr.opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
  auto rit = mrs_by_key_.find(wr.rkey);
  Mr* rmr = rit == mrs_by_key_.end() ? nullptr : rit->second;
  char* remote = rmr != nullptr && rmr->pd == peer->pd && (rmr->access & need) &&
                         (peer->attr.qp_access_flags & need)
                     ? Translate(*rmr, wr.remote_addr, total)
                     : nullptr;
  if (remote == nullptr) return fail(IBV_WC_REM_ACCESS_ERR);

  if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM && peer->rq.empty()) {
    if (q->attr.rnr_retry == 7) return false;  // RNR NAK, retried until a receive is posted
    return fail(IBV_WC_RNR_RETRY_EXC_ERR);
  }

  if (wr.opcode == IBV_WR_RDMA_READ) {
    uint64_t off = 0;
    for (size_t i = 0; i < wr.sges.size(); ++i) {
      std::memcpy(local[i], remote + off, wr.sges[i].length);
      off += wr.sges[i].length;
    }
  } else if (!wr.inline_data.empty()) {
    std::memcpy(remote, wr.inline_data.data(), wr.inline_data.size());
  } else {
    uint64_t off = 0;
    for (size_t i = 0; i < wr.sges.size(); ++i) {
      std::memcpy(remote + off, local[i], wr.sges[i].length);
      off += wr.sges[i].length;
    }
  }
  // The port counters: a WRITE's payload leaves our port, a READ's response leaves the
  // peer's. Counted before the completion, so a link that fails at this mark fails after
  // this work request was delivered and acknowledged, and before the next one.
  const bool read = wr.opcode == IBV_WR_RDMA_READ;
  Device& our_dev = *q->pd->context->device;
  const uint8_t our_port = static_cast<uint8_t>(std::max<int>(q->attr.port_num, 1));
  ++our_dev.counters[our_port - 1].requests;
  CountPort(our_dev, our_port, total, /*sent=*/!read);
  CountPort(*peer->pd->context->device, static_cast<uint8_t>(std::max<int>(peer->attr.port_num, 1)),
            total, /*sent=*/read);
  if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
    ibv_wc rwc = {};
    rwc.wr_id = peer->rq.front();
    peer->rq.pop_front();
    rwc.status = IBV_WC_SUCCESS;
    rwc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
    rwc.byte_len = static_cast<uint32_t>(total);
    rwc.imm_data = wr.imm;
    rwc.qp_num = peer->qp.qp_num;
    rwc.src_qp = q->qp.qp_num;
    rwc.wc_flags = IBV_WC_WITH_IMM;
    PushCqe(peer->recv_cq, rwc, nullptr, 0);
  }
  q->sq.pop_front();
  Complete(q, wr, IBV_WC_SUCCESS);
  return true;
}

void VerbsModel::Mover() {
  constexpr int kBurst = 16;  // WRs of one QP per turn: fairness between QPs
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (!paused_ && AnyRunnable());
    };
    // Wakes for a post, a state change, or the next transport retry deadline.
    mu_.AwaitWithDeadline(absl::Condition(&ready), NextRetryDeadline());
    if (stopping_) return;
    busy_ = true;
    std::vector<uint32_t> qpns;
    for (auto& [qpn, q] : qps_) qpns.push_back(qpn);
    for (uint32_t qpn : qpns) {
      for (int i = 0; i < kBurst && !paused_; ++i) {
        Qp* q = FindQp(qpn);
        if (q == nullptr || !Runnable(q) || !Execute(q)) break;
      }
      // Let posters and pollers in between QPs.
      mu_.Unlock();
      mu_.Lock();
    }
    busy_ = false;
  }
}

// ---------------------------------------------------------------- knobs and inspection

void VerbsModel::ForceError(uint32_t qpn) {
  absl::MutexLock lock(&mu_);
  if (Qp* q = FindQp(qpn)) ToError(q);
}

void VerbsModel::SetPaused(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
}

void VerbsModel::SetPeerMemoryLoaded(bool loaded) {
  absl::MutexLock lock(&mu_);
  peer_memory_loaded_ = loaded;
}

ibv_qp_state VerbsModel::QpState(uint32_t qpn) {
  absl::MutexLock lock(&mu_);
  Qp* q = FindQp(qpn);
  return q == nullptr ? IBV_QPS_UNKNOWN : q->qp.state;
}

ibv_qp_attr VerbsModel::QpAttributes(uint32_t qpn) {
  absl::MutexLock lock(&mu_);
  Qp* q = FindQp(qpn);
  return q == nullptr ? ibv_qp_attr{} : q->attr;
}

VerbsModel::SendCounts VerbsModel::SendStats(uint32_t qpn) {
  absl::MutexLock lock(&mu_);
  Qp* q = FindQp(qpn);
  if (q == nullptr) return {};
  return {q->posted, q->signaled, q->inlined};
}

size_t VerbsModel::ReceivesPosted(uint32_t qpn) {
  absl::MutexLock lock(&mu_);
  Qp* q = FindQp(qpn);
  return q == nullptr ? 0 : q->rq.size();
}

int VerbsModel::LiveObjects() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(contexts_.size() + pds_.size() + mrs_.size() + cqs_.size() + qps_.size());
}

int VerbsModel::MrAccess(uint32_t lkey) {
  absl::MutexLock lock(&mu_);
  auto it = mrs_by_key_.find(lkey);
  return it == mrs_by_key_.end() ? -1 : it->second->access;
}

uint64_t VerbsModel::CpuFaults() {
  absl::MutexLock lock(&mu_);
  return cpu_faults_;
}

uint64_t VerbsModel::CqOverruns() {
  absl::MutexLock lock(&mu_);
  return cq_overruns_;
}

void VerbsModel::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return paused_ || (!busy_ && !AnyRunnable() && NextRetryDeadline() == absl::InfiniteFuture());
  };
  mu_.Await(absl::Condition(&idle));
}

// ---------------------------------------------------------------- asynchronous events

namespace {

// The object an event is affiliated with (ibv_get_async_event(3) lists which carry a QP
// and which a CQ); null for the port and device events.
const void* ObjectOf(const ibv_async_event& e) {
  switch (e.event_type) {
    case IBV_EVENT_CQ_ERR:
      return e.element.cq;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return e.element.qp;
    default:
      return nullptr;
  }
}

}  // namespace

void VerbsModel::Raise(Context* context, ibv_event_type type, ibv_qp* qp, ibv_cq* cq, int port) {
  ibv_async_event e = {};
  e.event_type = type;
  if (qp != nullptr) e.element.qp = qp;
  if (cq != nullptr) e.element.cq = cq;
  if (qp == nullptr && cq == nullptr) e.element.port_num = port;
  context->events.push_back(e);
  ++events_raised_;
  const uint64_t one = 1;
  if (write(context->ctx.async_fd, &one, sizeof(one)) != sizeof(one)) std::abort();
}

int VerbsModel::GetAsyncEvent(ibv_context* context, ibv_async_event* event) {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(context);
  if (it == contexts_.end() || event == nullptr) {
    errno = EINVAL;
    return -1;
  }
  Context* c = it->second.get();
  if (c->events.empty()) {
    if (fcntl(context->async_fd, F_GETFL) & O_NONBLOCK) {
      errno = EAGAIN;
      return -1;
    }
    auto pending = [c]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !c->events.empty(); };
    mu_.Await(absl::Condition(&pending));
  }
  *event = c->events.front();
  c->events.pop_front();
  uint64_t count = 0;
  if (read(context->async_fd, &count, sizeof(count)) != sizeof(count)) std::abort();
  ++unacked_[ObjectOf(*event)];
  return 0;
}

void VerbsModel::AckAsyncEvent(ibv_async_event* event) {
  absl::MutexLock lock(&mu_);
  auto it = unacked_.find(ObjectOf(*event));
  if (it == unacked_.end()) return;
  if (--it->second <= 0) unacked_.erase(it);
}

bool VerbsModel::AwaitAcks(const void* object) {
  auto acked = [this, object]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return unacked_.find(object) == unacked_.end();
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&acked), absl::Seconds(5))) return true;
  ++blocked_destroys_;  // the real destroy would still be waiting
  return false;
}

void VerbsModel::SetPortState(const std::string& device, uint8_t port, ibv_port_state state) {
  absl::MutexLock lock(&mu_);
  for (auto& d : devices_) {
    if (d->config.name != device || port < 1 || port > d->config.ports.size()) continue;
    SetPortStateLocked(*d, port, state);
  }
}

void VerbsModel::SetPortStateLocked(Device& d, uint8_t port, ibv_port_state state) {
  d.config.ports[port - 1].state = state;
  for (auto& [handle, c] : contexts_) {
    if (c->device != &d) continue;
    Raise(c.get(), state == IBV_PORT_ACTIVE ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR, nullptr,
          nullptr, port);
  }
}

void VerbsModel::SetPortDownAfter(const std::string& device, uint8_t port, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  for (auto& d : devices_) {
    if (d->config.name != device || port < 1 || port > d->config.ports.size()) continue;
    const PortCounters& c = d->counters[port - 1];
    d->down_at[port - 1] = c.xmit_data + c.rcv_data + bytes;
    if (bytes == 0) CountPort(*d, port, 0, /*sent=*/true);
  }
}

void VerbsModel::CountPort(Device& d, uint8_t port, uint64_t bytes, bool sent) {
  PortCounters& c = d.counters[port - 1];
  (sent ? c.xmit_data : c.rcv_data) += bytes;
  if (c.xmit_data + c.rcv_data < d.down_at[port - 1]) return;
  d.down_at[port - 1] = UINT64_MAX;
  SetPortStateLocked(d, port, IBV_PORT_DOWN);
}

VerbsModel::PortCounters VerbsModel::Counters(const std::string& device, uint8_t port) {
  absl::MutexLock lock(&mu_);
  for (auto& d : devices_) {
    if (d->config.name == device && port >= 1 && port <= d->counters.size()) {
      return d->counters[port - 1];
    }
  }
  return {};
}

uint64_t VerbsModel::WorkOutstanding() {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (auto& [qpn, q] : qps_) n += q->sq.size();
  for (auto& [handle, cq] : cqs_) n += cq->entries.size();
  return n;
}

void VerbsModel::RaiseQpFatal(uint32_t qpn) {
  absl::MutexLock lock(&mu_);
  Qp* q = FindQp(qpn);
  if (q == nullptr) return;
  ToError(q);
  Raise(q->pd->context, IBV_EVENT_QP_FATAL, &q->qp, nullptr, 0);
}

void VerbsModel::LoseDevice(const std::string& device) {
  absl::MutexLock lock(&mu_);
  for (auto& d : devices_) {
    if (d->config.name == device) LoseDeviceLocked(*d);
  }
}

void VerbsModel::LoseDeviceLocked(Device& device) {
  Device* d = &device;
  d->lost = true;
  for (auto& [qpn, q] : qps_) {
    if (q->pd->context->device != d) continue;
    q->qp.state = IBV_QPS_ERR;
    q->attr.qp_state = IBV_QPS_ERR;
    q->sq.clear();
    q->rq.clear();
  }
  for (auto& [handle, cq] : cqs_) {
    if (cq->context->device == d) cq->entries.clear();
  }
  for (auto& [handle, c] : contexts_) {
    if (c->device == d) Raise(c.get(), IBV_EVENT_DEVICE_FATAL, nullptr, nullptr, 0);
  }
}

uint64_t VerbsModel::EventsRaised() {
  absl::MutexLock lock(&mu_);
  return events_raised_;
}

int VerbsModel::UnackedEvents() {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto& [object, count] : unacked_) n += count;
  return n;
}

uint64_t VerbsModel::BlockedDestroys() {
  absl::MutexLock lock(&mu_);
  return blocked_destroys_;
}

}  // namespace ferry::verbs::model
