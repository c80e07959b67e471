#pragma once
// The doctor checks that live in their own files (doctor.cc keeps the inventory, the GDR
// decision and the kernel support checks). RunDoctor calls each in turn; each appends its
// findings to `report` and reads sysfs/procfs only through `root`.

#include <cstdint>

#include "config/config.h"
#include "transport/topology/doctor.h"
#include "transport/topology/machine.h"
#include "transport/topology/plan.h"
#include "transport/topology/probes.h"
#include "transport/topology/sys_root.h"

namespace ferry::topology {

// iommu_check.cc: whether the IOMMU translates the DMA of each GPU and of each NIC the plan
// chose, from that device's own IOMMU group.
void CheckIommu(const Machine& machine, const TopologyPlan& plan, const SysRoot& root,
                DoctorReport& report);

// memlock_check.cc: RLIMIT_MEMLOCK against the host memory ferryd registers with a NIC.
void CheckMemlock(const TopologyPlan& plan, const config::Config& config,
                  const MemlockLimit& limit, DoctorReport& report);

// bar1_check.cc: each GPU's BAR1 aperture against the GPU pool the NIC reaches through it.
void CheckBar1(const Machine& machine, const SysRoot& root, uint64_t gpu_pool_bytes,
               DoctorReport& report);

// pcie_link_check.cc: links on the GPU-NIC paths that trained below what their ends support.
void CheckPcieLinks(const Machine& machine, const TopologyPlan& plan, const SysRoot& root,
                    DoctorReport& report);

// rail_check.cc: each GPU's chosen NIC against the NICs its traffic takes (rails.h), and NICs
// shared by GPUs while a selectable NIC as near to one of them serves none.
void CheckRails(const Machine& machine, const TopologyPlan& plan, DoctorReport& report);

}  // namespace ferry::topology
