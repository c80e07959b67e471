#pragma once
// Walks a list of iovecs as sendmsg/recvmsg consume them: a frame of headers, frame tables
// and payload pieces that one syscall may take only part of.

#include <limits.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace ferry::tcp {

class IovCursor {
 public:
  void Clear() {
    iov_.clear();
    pos_ = 0;
  }
  void Add(void* data, size_t length) { iov_.push_back({data, length}); }
  bool done() const { return pos_ == iov_.size(); }
  bool empty() const { return iov_.empty(); }

  // What the next sendmsg/recvmsg takes: the rest, at most IOV_MAX entries.
  iovec* next() { return &iov_[pos_]; }
  size_t next_count() const { return std::min<size_t>(iov_.size() - pos_, IOV_MAX); }

  // The entry next() starts with cannot be read (sendmsg failed EFAULT: memory another
  // process took away): the rest of it is sent as zeros instead, from `zeros` (`size`
  // bytes), cut into entries of at most that size, so that the frame keeps its length.
  void ZeroNext(const char* zeros, size_t size) {
    size_t left = iov_[pos_].iov_len;
    std::vector<iovec> padding;
    for (; left > 0; left -= std::min(left, size)) {
      padding.push_back({const_cast<char*>(zeros), std::min(left, size)});
    }
    iov_.erase(iov_.begin() + static_cast<std::ptrdiff_t>(pos_));
    iov_.insert(iov_.begin() + static_cast<std::ptrdiff_t>(pos_), padding.begin(), padding.end());
  }

  // `n` bytes went: skips the entries they covered and trims the one they ended in.
  void Consume(size_t n) {
    while (pos_ < iov_.size() && n >= iov_[pos_].iov_len) {
      n -= iov_[pos_].iov_len;
      ++pos_;
    }
    if (pos_ < iov_.size()) {
      iov_[pos_].iov_base = static_cast<char*>(iov_[pos_].iov_base) + n;
      iov_[pos_].iov_len -= n;
    }
  }

 private:
  std::vector<iovec> iov_;
  size_t pos_ = 0;
};

}  // namespace ferry::tcp
