#include "transport/topology/machine.h"

#include <cstdio>
#include <tuple>

namespace ferry::topology {

bool Nic::Usable() const {
  if (ports.empty()) return true;
  for (const NicPort& port : ports) {
    if (port.state.empty() || port.Active()) return true;
  }
  return false;
}

double Nic::RateGbps() const {
  double best = 0;
  for (const NicPort& port : ports) {
    if (port.Active() && port.rate_gbps > best) best = port.rate_gbps;
  }
  return best;
}

std::optional<int> Machine::FindNic(const std::string& name) const {
  for (size_t i = 0; i < nics.size(); ++i) {
    if (nics[i].name == name) return static_cast<int>(i);
  }
  return std::nullopt;
}

bool ParsePciAddress(const std::string& text, unsigned* domain, unsigned* bus,
                     unsigned* device, unsigned* function) {
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x%n", domain, bus, device, function, &consumed) !=
          4 ||
      consumed != static_cast<int>(text.size())) {
    return false;
  }
  return true;
}

bool PciLess(const std::string& a, const std::string& b) {
  unsigned ad, ab, adev, af, bd, bb, bdev, bf;
  if (ParsePciAddress(a, &ad, &ab, &adev, &af) && ParsePciAddress(b, &bd, &bb, &bdev, &bf)) {
    return std::tie(ad, ab, adev, af) < std::tie(bd, bb, bdev, bf);
  }
  return a < b;
}

}  // namespace ferry::topology
