#pragma once
// Peer memory: how a NIC reaches device memory that the CPU cannot. On a GPU machine the
// nvidia_peermem module registers a "peer memory client" with the kernel's RDMA core; when
// ibv_reg_mr is handed a cudaMalloc pointer the kernel gets the GPU's pages from that
// client, because get_user_pages fails (EFAULT) on a virtual address without CPU pages
// behind it (NVIDIA, "GPUDirect RDMA", "Using nvidia-peermem"; ibv_reg_mr(3)).
//
// This is that client list for the simulation: a simulated GPU adds each slab's device range
// with a mapping of the same memory that a NIC may use, and the NIC stand-ins (the tcp
// provider; in tests the fake fabric and the software verbs model) look device ranges up
// here instead of touching the device address. Real CUDA memory is never added, so on a GPU
// machine every lookup fails and those stand-ins refuse device memory, as they must.
//
// One process-wide table rather than a setter wired into each provider: the kernel's list of
// peer clients is host-wide too, and inside ferryd the simulated GPUs and the tcp provider
// meet only through the agent core, which should not have to know that its GPUs are
// simulated. It lives in transport/memory, the one layer both GPUs and providers may use.

#include "transport/memory/device_ranges.h"

namespace ferry::memory {

// The process's peer-memory table: device range -> the bytes a NIC reaches it through. A
// range's bytes stay mapped while a registration holds them, as pages a peer client pinned
// (get_pages) stay until the registration releases them (put_pages).
DeviceRanges& PeerMemory();

}  // namespace ferry::memory
