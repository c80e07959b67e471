#include "bench/ferry_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/stats.h"
#include "base/status_macros.h"
#include "client/transfer_stream.h"

namespace ferry::bench {
namespace {

// The untimed runs of `batch` before the timed ones (RunOptions::warmup).
absl::Status WarmUp(Client& client, const std::vector<OpSpec>& batch, const RunOptions& options) {
  for (int w = 0; w < options.warmup; ++w) {
    auto result = client.Run(batch);
    RETURN_IF_ERROR(result.status());
    RETURN_IF_ERROR(TransferStatus(*result));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FerryRunner>> FerryRunner::Create(const Agents& agents,
                                                                 uint64_t capacity) {
  std::unique_ptr<FerryRunner> r(new FerryRunner(agents, capacity));
  auto a = Client::Connect(agents.socket_a);
  if (!a.ok()) return a.status();
  auto b = Client::Connect(agents.socket_b);
  if (!b.ok()) return b.status();
  r->a_ = std::move(*a);
  r->b_ = std::move(*b);
  r->dst_name_ = absl::StrCat("ferry-bench-", getpid());
  auto src = r->a_->Alloc(capacity);
  if (!src.ok()) return src.status();
  auto dst = r->b_->Alloc(capacity, r->dst_name_);
  if (!dst.ok()) return dst.status();
  r->src_ = std::move(*src);
  r->dst_ = std::move(*dst);
  std::memset(r->src_->data(), 0x5a, capacity);
  std::memset(r->dst_->data(), 0, capacity);
  return r;
}

FerryRunner::~FerryRunner() {
  if (src_) a_->Free(src_->id()).IgnoreError();
  if (dst_) b_->Free(dst_->id()).IgnoreError();
}

absl::StatusOr<Measurement> FerryRunner::RunSize(uint64_t size, const RunOptions& options) {
  if (size > capacity_)
    return absl::InvalidArgumentError(absl::StrCat("size ", size, " > capacity"));
  uint64_t k = std::clamp<uint64_t>(options.batch_bytes / size, 1, options.outstanding);
  k = std::min<uint64_t>(k, capacity_ / size);
  std::vector<OpSpec> batch;
  for (uint64_t i = 0; i < k; ++i) {
    batch.push_back({options.op, src_->id(), i * size, agents_.node_b, dst_name_, i * size, size});
  }
  return Run(absl::StrCat("ferry ", options.op == ferry::v1::WRITE ? "write" : "read"), size, batch,
             options);
}

std::vector<OpSpec> FerryRunner::KvBatch(uint32_t blocks, uint64_t block, bool adjacent,
                                         uint64_t first, uint64_t slots,
                                         ferry::v1::OpType op) const {
  // Distinct slots in random order: scattered, as a paged KV cache is.
  std::vector<uint64_t> order(slots);
  std::iota(order.begin(), order.end(), first);
  if (!adjacent) std::shuffle(order.begin(), order.end(), std::mt19937_64(11));
  std::vector<OpSpec> batch;
  for (uint32_t i = 0; i < blocks; ++i) {
    const uint64_t from = adjacent ? order[i] : order[slots - 1 - i];
    batch.push_back(
        {op, src_->id(), from * block, agents_.node_b, dst_name_, order[i] * block, block});
  }
  return batch;
}

absl::StatusOr<Measurement> FerryRunner::RunKv(uint32_t blocks, uint64_t block,
                                               const RunOptions& options, bool adjacent) {
  const uint64_t slots = capacity_ / block;
  if (slots < blocks) return absl::InvalidArgumentError("capacity too small for the KV batch");
  return Run("ferry kv", block, KvBatch(blocks, block, adjacent, 0, slots, options.op), options);
}

absl::StatusOr<Measurement> FerryRunner::RunStreamedOps(uint64_t size, uint32_t outstanding,
                                                        const RunOptions& options) {
  if (capacity_ / size < outstanding) return absl::InvalidArgumentError("capacity too small");
  // Each op in flight has a slot of its own: no two in flight touch the same bytes.
  std::vector<std::vector<OpSpec>> batches;
  for (uint64_t slot = 0; slot < outstanding; ++slot) {
    batches.push_back({{ferry::v1::WRITE, src_->id(), slot * size, agents_.node_b, dst_name_,
                        slot * size, size}});
  }
  auto m = RunStreamed(outstanding == 1 ? "ferry stream lat" : "ferry stream", size, batches,
                       options);
  if (m.ok()) m->note = absl::StrCat("one TransferStream, ", outstanding, " ops in flight");
  return m;
}

absl::StatusOr<Measurement> FerryRunner::RunStreamedBatches(uint32_t blocks, uint64_t block,
                                                            const RunOptions& options) {
  // Each batch scatters over its own half of the buffers.
  const uint64_t half = capacity_ / block / 2;
  if (half < blocks) return absl::InvalidArgumentError("capacity too small for two batches");
  std::vector<std::vector<OpSpec>> batches;
  for (uint64_t k = 0; k < 2; ++k) {
    batches.push_back(KvBatch(blocks, block, /*adjacent=*/false, k * half, half, ferry::v1::WRITE));
  }
  auto m = RunStreamed(blocks == 1 ? "ferry write stream" : "ferry kv stream", block, batches,
                       options);
  if (m.ok()) m->note = "one TransferStream, 2 batches in flight";
  return m;
}

absl::StatusOr<Measurement> FerryRunner::RunStreamed(
    const std::string& series, uint64_t size, const std::vector<std::vector<OpSpec>>& batches,
    const RunOptions& options) {
  auto stream = a_->OpenTransferStream();
  if (!stream.ok()) return stream.status();
  // Tag k is batches[k]'s, sent again as soon as its answer is in.
  std::vector<absl::Time> sent(batches.size());
  auto send = [&](uint64_t k) {
    sent[k] = absl::Now();
    return (*stream)->Send(k, batches[k]);
  };
  for (int w = 0; w < options.warmup; ++w) {
    for (uint64_t k = 0; k < batches.size(); ++k) RETURN_IF_ERROR(send(k));
    for (uint64_t k = 0; k < batches.size(); ++k) {
      auto answer = (*stream)->Next();
      if (!answer.ok()) return answer.status();
      RETURN_IF_ERROR(answer->result.status());
      RETURN_IF_ERROR(TransferStatus(*answer->result));
    }
  }
  const absl::Time start = absl::Now();
  const absl::Time until = start + absl::Seconds(options.min_seconds);
  for (uint64_t k = 0; k < batches.size(); ++k) RETURN_IF_ERROR(send(k));
  std::vector<double> latencies;
  uint64_t ops = 0, bytes = 0;
  size_t in_flight = batches.size();
  while (in_flight > 0) {
    auto answer = (*stream)->Next();
    if (!answer.ok()) return answer.status();
    const uint64_t k = answer->tag;
    if (k >= batches.size()) return absl::InternalError("an answer to an unknown tag");
    latencies.push_back(absl::ToDoubleMicroseconds(absl::Now() - sent[k]));
    RETURN_IF_ERROR(answer->result.status());
    RETURN_IF_ERROR(TransferStatus(*answer->result));
    ops += batches[k].size();
    bytes += answer->result->bytes();
    const bool more = absl::Now() < until ||
                      latencies.size() < static_cast<size_t>(options.min_iterations);
    const bool room = latencies.size() + in_flight <
                      static_cast<size_t>(options.max_iterations) * batches.size();
    if (more && room) {
      RETURN_IF_ERROR(send(k));
    } else {
      --in_flight;
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  RETURN_IF_ERROR((*stream)->CloseSend());
  if (auto extra = (*stream)->Next(); extra.ok()) return absl::InternalError("an extra answer");
  RETURN_IF_ERROR((*stream)->Finish());
  Measurement m;
  m.series = series;
  m.size = size;
  m.batch = batches[0].size();
  m.ops = ops;
  m.bytes = bytes;
  SetTimings(m, seconds, latencies);
  return m;
}

absl::StatusOr<Measurement> FerryRunner::Run(const std::string& series, uint64_t size,
                                             const std::vector<OpSpec>& batch,
                                             const RunOptions& options) {
  // Each client thread has its own connection and runs batches until time is up.
  absl::Mutex mu;
  std::vector<double> latencies;
  std::vector<double> agent_us;  // each batch's duration as the agent measured it
  uint64_t iterations = 0;
  absl::Status failure;
  absl::Time start, until;
  auto worker = [&](Client* client) {
    int done = 0;
    while (true) {
      absl::Time t0 = absl::Now();
      auto result = client->Run(batch);
      absl::Status s = result.ok() ? TransferStatus(*result) : result.status();
      double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
      absl::MutexLock lock(&mu);
      if (!s.ok()) {
        failure = s;
        return;
      }
      latencies.push_back(us);
      agent_us.push_back(static_cast<double>(result->duration_us()));
      ++iterations;
      ++done;
      bool enough_time = absl::Now() >= until && done >= options.min_iterations;
      if (enough_time || done >= options.max_iterations || !failure.ok()) return;
    }
  };
  std::vector<std::unique_ptr<Client>> extra;
  std::vector<Client*> clients = {a_.get()};
  for (int c = 1; c < options.clients; ++c) {
    auto more = Client::Connect(agents_.socket_a);
    if (!more.ok()) return more.status();
    extra.push_back(std::move(*more));
    clients.push_back(extra.back().get());
  }
  for (Client* client : clients) RETURN_IF_ERROR(WarmUp(*client, batch, options));
  start = absl::Now();
  until = start + absl::Seconds(options.min_seconds);
  std::vector<std::thread> threads;
  for (Client* client : clients) threads.emplace_back(worker, client);
  for (auto& t : threads) t.join();
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!failure.ok()) return failure;
  Measurement m;
  m.series = series;
  m.size = size;
  m.batch = batch.size();
  m.ops = iterations * batch.size();
  uint64_t batch_bytes = 0;
  for (const auto& op : batch) batch_bytes += op.length;
  m.bytes = iterations * batch_bytes;
  SetTimings(m, seconds, latencies);
  m.agent_p50_us = Percentile(std::move(agent_us), 0.5);
  if (options.clients > 1) m.note = absl::StrCat(options.clients, " clients");
  return m;
}

absl::Status FerryRunner::RunLong(uint64_t total, const std::function<void(bool early)>& sample) {
  constexpr uint64_t kOp = 64ull << 20;
  uint64_t per_batch = std::min<uint64_t>(capacity_ / kOp, 4);
  if (per_batch == 0) return absl::InvalidArgumentError("capacity below 64 MiB");
  std::vector<OpSpec> batch;
  for (uint64_t i = 0; i < per_batch; ++i) {
    batch.push_back(
        {ferry::v1::WRITE, src_->id(), i * kOp, agents_.node_b, dst_name_, i * kOp, kOp});
  }
  uint64_t moved = 0;
  bool sampled_early = false;
  while (moved < total) {
    auto result = a_->Run(batch);
    absl::Status s = result.ok() ? TransferStatus(*result) : result.status();
    if (!s.ok()) return s;
    moved += per_batch * kOp;
    if (!sampled_early && moved >= (1ull << 30)) {
      sample(true);
      sampled_early = true;
    }
  }
  sample(false);
  return absl::OkStatus();
}

}  // namespace ferry::bench
