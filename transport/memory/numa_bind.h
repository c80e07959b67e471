#pragma once
// Placing memory on a NUMA node (the NIC's), before its pages are first touched.

#include <cstdint>
#include <memory>
#include <string>

struct hwloc_topology;  // hwloc.h, kept out of this header
struct hwloc_obj;

namespace ferry::memory {

// Binds [p, p+n) to NUMA node `numa` (hwloc membind, strict) before first touch. Returns how
// it went, in words ("NUMA node 0 (hwloc membind)", or "no NUMA binding (why)"); a failed
// binding leaves the memory where the kernel puts it.
std::string BindToNode(void* p, uint64_t n, int numa);

// The same for many ranges, with the machine's topology loaded once (hwloc_topology_load
// reads sysfs: milliseconds, too slow to repeat per buffer). A pool whose buffers are files
// of their own binds each buffer's mapping as it is made (a policy belongs to a mapping, and
// a new MAP_FIXED mapping starts without one, mbind(2)).
class NodeBinding {
 public:
  // nullptr when the memory cannot be bound to `numa`; `placement` then says why, else
  // "NUMA node N (hwloc membind)".
  static std::unique_ptr<NodeBinding> Load(int numa, std::string* placement);
  ~NodeBinding();
  NodeBinding(const NodeBinding&) = delete;
  NodeBinding& operator=(const NodeBinding&) = delete;

  // Binds [p, p+n); "" when done, else why not (the memory stays where the kernel puts it).
  std::string Bind(void* p, uint64_t n) const;

 private:
  NodeBinding(hwloc_topology* topo, hwloc_obj* node) : topo_(topo), node_(node) {}
  hwloc_topology* topo_;
  hwloc_obj* node_;
};

}  // namespace ferry::memory
