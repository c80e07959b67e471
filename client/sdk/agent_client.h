#pragma once
// The agent-side clients (client/ferry_client.h, tensor_client.h) under names of their own, for
// libferry's implementation. Include this before any public <ferry/...> header: once those are
// seen, ferry::Client names both classes and is ambiguous (the include order is then a compile
// error here, not a wrong class).

#include "client/ferry_client.h"
#include "client/tensor_client.h"

namespace ferry::agent_client {
using Client = ::ferry::Client;
using Buffer = ::ferry::Buffer;
using OpSpec = ::ferry::OpSpec;
using TensorClient = ::ferry::TensorClient;
using BlockSpec = ::ferry::BlockSpec;
using CallOptions = ::ferry::CallOptions;
}  // namespace ferry::agent_client
