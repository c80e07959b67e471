#include "transport/memory/numa_bind.h"

#include <hwloc.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ferry::memory {

std::unique_ptr<NodeBinding> NodeBinding::Load(int numa, std::string* placement) {
  if (numa < 0) {
    *placement = "no NUMA binding (node unknown)";
    return nullptr;
  }
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) {
    *placement = "no NUMA binding (hwloc_topology_init failed)";
    return nullptr;
  }
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    *placement = "no NUMA binding (hwloc_topology_load failed)";
    return nullptr;
  }
  hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(topo, static_cast<unsigned>(numa));
  if (node == nullptr) {
    hwloc_topology_destroy(topo);
    *placement = absl::StrCat("no NUMA binding (this machine has no NUMA node ", numa, ")");
    return nullptr;
  }
  *placement = absl::StrCat("NUMA node ", numa, " (hwloc membind)");
  return std::unique_ptr<NodeBinding>(new NodeBinding(topo, node));
}

NodeBinding::~NodeBinding() { hwloc_topology_destroy(topo_); }

std::string NodeBinding::Bind(void* p, uint64_t n) const {
  if (hwloc_set_area_membind(topo_, p, n, node_->nodeset, HWLOC_MEMBIND_BIND,
                             HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT) != 0) {
    return absl::StrCat("hwloc_set_area_membind: ", strerror(errno));
  }
  return "";
}

std::string BindToNode(void* p, uint64_t n, int numa) {
  std::string placement;
  std::unique_ptr<NodeBinding> binding = NodeBinding::Load(numa, &placement);
  if (binding == nullptr) return placement;
  std::string failed = binding->Bind(p, n);
  if (!failed.empty()) return absl::StrCat("no NUMA binding (", failed, ")");
  return placement;
}

}  // namespace ferry::memory
