#pragma once
// Unpredictable bytes from the kernel (getrandom(2), the same pool as /dev/urandom), for
// secrets and keys a peer must not guess. Not std::rand or a seeded PRNG: their output
// follows from a few observed values.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry {

// Fills [out, out+n). Blocks only until the kernel's pool is initialised (early boot);
// fails with the errno of getrandom(2) otherwise.
absl::Status RandomBytes(void* out, size_t n);

template <typename T>
absl::StatusOr<T> RandomValue() {
  T value;
  absl::Status s = RandomBytes(&value, sizeof(value));
  if (!s.ok()) return s;
  return value;
}

}  // namespace ferry
