#include "transport/memory/numa_bind.h"

#include <hwloc.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ferry::memory {

std::string BindToNode(void* p, uint64_t n, int numa) {
  if (numa < 0) return "no NUMA binding (node unknown)";
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return "no NUMA binding (hwloc_topology_init failed)";
  std::string result;
  if (hwloc_topology_load(topo) != 0) {
    result = "no NUMA binding (hwloc_topology_load failed)";
  } else {
    hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(topo, static_cast<unsigned>(numa));
    if (node == nullptr) {
      result = absl::StrCat("no NUMA binding (this machine has no NUMA node ", numa, ")");
    } else if (hwloc_set_area_membind(topo, p, n, node->nodeset, HWLOC_MEMBIND_BIND,
                                      HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT) != 0) {
      result = absl::StrCat("no NUMA binding (hwloc_set_area_membind: ", strerror(errno), ")");
    } else {
      result = absl::StrCat("NUMA node ", numa, " (hwloc membind)");
    }
  }
  hwloc_topology_destroy(topo);
  return result;
}


}  // namespace ferry::memory
