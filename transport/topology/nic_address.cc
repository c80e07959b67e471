#include "transport/topology/nic_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry::topology {

absl::StatusOr<std::string> NicAddress(const SysRoot& sys, const std::string& nic) {
  const std::vector<std::string> netdevs =
      sys.List(absl::StrCat("/sys/class/infiniband/", nic, "/device/net"));
  if (netdevs.empty()) {
    return absl::NotFoundError(absl::StrCat(nic, " has no network interface (",
                                            sys.Path(absl::StrCat("/sys/class/infiniband/", nic,
                                                                  "/device/net")),
                                            " is empty)"));
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("getifaddrs (for ", nic, ")"));
  }
  std::string found;
  for (const std::string& netdev : netdevs) {
    for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
      if (netdev != a->ifa_name) continue;
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) found = text;
    }
  }
  freeifaddrs(list);
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat(nic, "'s interface ", absl::StrJoin(netdevs, ", "),
                                            " has no IPv4 address"));
  }
  return found;
}

}  // namespace ferry::topology
