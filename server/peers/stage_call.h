#pragma once
// The sending side of one Peer Stage call, as the engine sees it: no gRPC here (the gRPC
// client is stage_client.cc; tests give the engine their own). One call serves one remote
// buffer and direction for a whole transfer.
//
// WRITE into a staged peer GPU: the peer grants bounce chunks as credits (TakeGrant); we
// WRITE a chunk into one and Report it; the peer copies it into its GPU, says so
// (StageEvents::OnCopied) and grants the chunk again. READ from a staged peer GPU: we ask
// for a range (Fetch), the peer copies it out into a chunk and grants it; we READ it and
// give the chunk back (GrantLease, which Releases it when dropped).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ferry::server {

// A bounce chunk of the peer's, granted to us: where our fabric reaches it.
struct StageGrant {
  uint64_t grant = 0;    // the peer's id for it, echoed in Report / Release
  uint64_t address = 0;  // for our provider's RemoteSlice
  uint32_t key = 0;
  uint64_t length = 0;   // bytes in it (READ) or room in it (WRITE)
  uint64_t token = 0;    // READ: the Fetch it answers
};

struct StageCallSpec {
  std::string node;      // the peer
  std::string buffer;    // its buffer, by name
  bool read = false;     // direction: READ from the buffer, or WRITE into it
  std::string provider;  // the fabric our endpoint to the peer uses (which keys to grant)
  uint64_t chunk_bytes = 0;
  uint32_t depth = 0;    // chunks in flight we would like; the peer may grant fewer
  absl::Time deadline;   // of the transfer: bounds the call
  std::string nic;       // the peer's NIC of `provider` our endpoint reaches ("" = its first)
};

class StageCall;

// What a call reports to the one that opened it, on the call's own thread.
class StageEvents {
 public:
  virtual ~StageEvents() = default;
  // The peer copied `bytes` of the chunk reported with `token` into its GPU.
  virtual void OnCopied(uint64_t token, uint64_t bytes) = 0;
  // The call ended badly: nothing more will be copied or granted through it.
  virtual void OnCallFailed(const StageCall* call, const absl::Status& why) = 0;
};

class StageCall : public std::enable_shared_from_this<StageCall> {
 public:
  virtual ~StageCall() = default;

  virtual const StageCallSpec& spec() const = 0;
  // Opens the call and waits (until the spec's deadline) for the peer's first grant.
  virtual absl::Status Open() = 0;
  // The peer's chunk size (after Open): no chunk we send or fetch is longer.
  virtual uint64_t grant_length() const = 0;
  // Ends the call early (agent stopping, transfer cancelled); waits nothing.
  virtual void Cancel() = 0;

  // WRITE: one granted chunk, waiting until `deadline`; why not when the call ended.
  virtual absl::StatusOr<StageGrant> TakeGrant(absl::Time deadline) = 0;
  // WRITE: chunk `grant` holds `length` bytes for `offset` of the buffer; false when the
  // peer closed the call.
  virtual bool Report(uint64_t grant, uint64_t offset, uint64_t length, uint64_t token) = 0;

  // READ: asks the peer to copy [offset, offset+length) out of its GPU. `ready` runs once,
  // on the call's thread, with the granted chunk or why it will not come.
  using Ready = absl::AnyInvocable<void(absl::StatusOr<StageGrant>) &&>;
  virtual void Fetch(uint64_t offset, uint64_t length, Ready ready) = 0;
  // READ: chunk `grant` may be reused (through GrantLease).
  virtual void Release(uint64_t grant) = 0;

  // No more chunks: waits for the peer's verdict once every copy is done.
  virtual absl::Status Close(absl::Time deadline) = 0;
};

// Opens nothing yet: makes the call for `spec`, reporting to `events` (which outlives it).
using StageCallFactory = std::function<absl::StatusOr<std::shared_ptr<StageCall>>(
    const StageCallSpec& spec, StageEvents* events)>;

// A chunk the peer granted for a READ, held: the peer gets it back (Release) when the lease
// is dropped. Move-only.
class GrantLease {
 public:
  GrantLease() = default;
  GrantLease(std::shared_ptr<StageCall> call, uint64_t grant)
      : call_(std::move(call)), grant_(grant) {}
  GrantLease(GrantLease&& other) noexcept = default;
  GrantLease& operator=(GrantLease&& other) noexcept {
    if (this != &other) {
      Return();
      call_ = std::move(other.call_);
      grant_ = other.grant_;
    }
    return *this;
  }
  GrantLease(const GrantLease&) = delete;
  GrantLease& operator=(const GrantLease&) = delete;
  ~GrantLease() { Return(); }

 private:
  void Return() {
    if (call_) call_->Release(grant_);
    call_.reset();
  }
  std::shared_ptr<StageCall> call_;
  uint64_t grant_ = 0;
};

}  // namespace ferry::server
