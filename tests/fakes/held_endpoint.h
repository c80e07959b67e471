#pragma once
// An endpoint that records every post and completes them only when the test says so, in
// order (as a slow wire would); Refuse() makes it a broken connection (posts UNAVAILABLE).

#include <deque>

#include "absl/synchronization/mutex.h"
#include "transport/fabric.h"

namespace ferry::fake {

class HeldEndpoint : public fabric::Endpoint {
 public:
  absl::Status PostWrite(const fabric::LocalSlice& src, const fabric::RemoteSlice& dst,
                         fabric::Completion done) override {
    absl::MutexLock lock(&mu_);
    if (refuse_) return absl::UnavailableError("refused");
    posted_.push_back({src.length, dst.address, std::move(done)});
    return absl::OkStatus();
  }
  absl::Status PostWriteWithImmediate(const fabric::LocalSlice& src, const fabric::RemoteSlice& dst,
                                      uint32_t, fabric::Completion done) override {
    return PostWrite(src, dst, std::move(done));
  }
  absl::Status PostRead(const fabric::LocalSlice& dst, const fabric::RemoteSlice& src,
                        fabric::Completion done) override {
    return PostWrite(dst, src, std::move(done));
  }
  bool broken() const override {
    absl::MutexLock lock(&mu_);
    return refuse_;
  }
  void Close() override {}

  // Completes the oldest posted op with `status`; false if none is posted.
  bool CompleteOne(absl::Status status = absl::OkStatus()) {
    fabric::Completion done;
    {
      absl::MutexLock lock(&mu_);
      if (posted_.empty()) return false;
      done = std::move(posted_.front().done);
      posted_.pop_front();
    }
    std::move(done)(std::move(status));
    return true;
  }
  size_t posted() const {
    absl::MutexLock lock(&mu_);
    return posted_.size();
  }
  uint64_t address(size_t i) const {
    absl::MutexLock lock(&mu_);
    return posted_[i].address;
  }
  void Refuse() {
    absl::MutexLock lock(&mu_);
    refuse_ = true;
  }

 private:
  struct Posted {
    uint64_t length;
    uint64_t address;
    fabric::Completion done;
  };
  mutable absl::Mutex mu_;
  std::deque<Posted> posted_;
  bool refuse_ = false;
};


}  // namespace ferry::fake
