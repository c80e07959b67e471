#pragma once
// Plain state -> the Agent API's messages: buffers, GPU pools, bounce pools. The one place
// the services turn what the buffers layer keeps into protos, so that layer needs no protos.

#include "ferry/v1/agent.pb.h"
#include "server/buffers/bounce_pools.h"
#include "server/buffers/buffer_registry.h"
#include "server/buffers/gpu_pools.h"

namespace ferry::server {

// How a client maps the buffer and how it is registered, with its owner.
void DescribeBuffer(const Buffer& buffer, ferry::v1::BufferInfo* info);
void FillGpuInfo(const GpuPoolStats& stats, ferry::v1::GpuInfo* info);
void FillBouncePool(const BouncePoolStats& stats, ferry::v1::BouncePoolInfo* info);

}  // namespace ferry::server
