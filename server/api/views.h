#pragma once
// The Agent API's operator views, from the agent's live state: peers and their health
// (ListPeers), running and recent transfers (ListTransfers), transfers added up (GetStats).

#include "ferry/v1/agent.pb.h"

namespace ferry::server {

class AgentCore;

void DescribePeers(AgentCore& core, ferry::v1::ListPeersResponse* out);
// The running transfers and the `recent` newest finished ones; with `owner_uid` >= 0, only
// that uid's (of those newest).
void DescribeTransfers(AgentCore& core, uint32_t recent, ferry::v1::ListTransfersResponse* out,
                       int64_t owner_uid = -1);
void DescribeStats(AgentCore& core, ferry::v1::GetStatsResponse* out);

// The upper bound of the bucket holding quantile `q` (0..1) of a histogram of `buckets`
// (not cumulative) over `bounds`; 0 without samples. Shared with the metrics exporter.
double BucketQuantile(const std::vector<double>& bounds, const std::vector<uint64_t>& buckets,
                      double q);

}  // namespace ferry::server
