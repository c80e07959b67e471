#pragma once
// The agent-side client (client/ferry_client.h) under names of its own, for libferry's
// implementation. Include this before any public <ferry/...> header: once those are seen,
// ferry::Client names both classes and is ambiguous (the include order is then a compile
// error here, not a wrong class).

#include "client/ferry_client.h"

namespace ferry::agent_client {
using Client = ::ferry::Client;
using Buffer = ::ferry::Buffer;
using OpSpec = ::ferry::OpSpec;
}  // namespace ferry::agent_client
