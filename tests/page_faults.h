#pragma once
// What a test needs to say that memory is in place before it is used: the minor page faults
// this process has taken, and how much of a range is in memory.

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {

// Minor faults this process has taken (getrusage(2)).
inline long MinorFaults() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Writes one byte into each page of [data, data + size), as a transfer's copy would touch
// them. Not instrumented: a sanitizer's check of each store would fault in its own shadow
// pages, which are no fault of the memory under test.
__attribute__((no_sanitize("address", "thread"))) inline void TouchPages(char* data,
                                                                         uint64_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (uint64_t i = 0; i < size; i += page) static_cast<volatile char*>(data)[i] = 1;
}

// How many pages of [data, data + size) are in memory (mincore(2): for a shared mapping, the
// pages of the file that exist).
inline size_t ResidentPages(const char* data, uint64_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((size + page - 1) / page);
  EXPECT_EQ(mincore(const_cast<char*>(data), size, in.data()), 0) << "mincore: " << errno;
  size_t n = 0;
  for (unsigned char v : in) n += v & 1;
  return n;
}

}  // namespace ferry
