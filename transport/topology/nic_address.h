#pragma once
// The IP address a NIC's tcp traffic uses, for tcp rails derived from the NICs themselves
// (`tcp.rails: auto`): the RDMA device's network interface (a RoCE or IPoIB netdev,
// /sys/class/infiniband/<nic>/device/net/<ifname>) and that interface's first IPv4 address.

#include <string>

#include "absl/status/statusor.h"
#include "transport/topology/sys_root.h"

namespace ferry::topology {

// NOT_FOUND, saying which, when the NIC has no network interface or the interface has no
// IPv4 address. Interface names come from `sys` (a fixture in tests); addresses from the
// live machine (getifaddrs).
absl::StatusOr<std::string> NicAddress(const SysRoot& sys, const std::string& nic);

}  // namespace ferry::topology
