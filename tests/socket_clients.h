#pragma once
// How many connections an agent counts on its transfer socket (GetInfo), for tests that
// check which way a client's transfers went and that the connections close after them.

#include <cstdint>

#include "absl/time/clock.h"
#include "client/ferry_client.h"
#include "gtest/gtest.h"

namespace ferry {

inline uint64_t SocketClients(Client& client) {
  auto info = client.GetInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->transfer_socket_clients() : ~0ull;
}

// Polls until the agent counts `want` connections to its transfer socket.
inline void ExpectSocketClients(Client& client, uint64_t want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  uint64_t now = SocketClients(client);
  while (now != want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    now = SocketClients(client);
  }
  EXPECT_EQ(now, want);
}

}  // namespace ferry
