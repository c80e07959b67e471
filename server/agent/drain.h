#pragma once
// Graceful drain: how a ferryd told to stop (SIGTERM) lets go of its work, in this order:
//
//   1. DrainHooks, in the order added: discovery deregistration comes first (peers stop
//      choosing this node before it starts refusing), then readiness (gRPC health of the
//      Peer API goes NOT_SERVING, so a Kubernetes probe takes the pod out).
//   2. New transfers are refused: Submit, Transfer and the tensor API's Send, Recv and
//      WriteBlocks answer UNAVAILABLE "agent is draining ..." (kDrainingMessage), and
//      peers' ResolveBuffer too, so their new transfers to this node fail at Submit, not
//      half way.
//   3. Transfers running here get up to `grace` (limits.shutdown_grace_ms) to finish.
//   4. Those still running are ended: their open ops fail UNAVAILABLE "agent is shutting
//      down" (said with the grace they had).
//
// main.cc then stops the gRPC servers, tears the agent down, removes the socket, exits 0.
// Transfers that peers run into this node's memory are not waited for (this engine does not
// know them); step 2 keeps new ones from starting.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry::server {

class AgentCore;

// What the agent does first when it drains. Discovery (etcd) deregistration adds its hook
// here; so does main.cc for readiness.
class DrainHooks {
 public:
  // `name` goes in the log. Runs on the thread that drains (main's signal thread), before
  // anything is refused; it should return within a second or two (its own timeout), since
  // the grace is counted after the hooks ran.
  void Add(std::string name, std::function<void()> hook);
  // Runs every hook once, in the order added; later calls do nothing.
  void RunAll();

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::string, std::function<void()>>> hooks_ ABSL_GUARDED_BY(mu_);
  bool ran_ ABSL_GUARDED_BY(mu_) = false;
};

struct DrainOutcome {
  size_t running = 0;    // transfers running when new ones were refused
  size_t cancelled = 0;  // of those, ended when the grace ran out (or was cut short)
  absl::Duration waited;
};

// Steps 1 to 4 above. `cut_short` is asked every 100 ms while transfers run: true ends the
// grace at once (a second SIGTERM, or SIGINT, during the drain). Logs each step.
DrainOutcome Drain(AgentCore& core, absl::Duration grace, const std::function<bool()>& cut_short);

}  // namespace ferry::server
