#include "base/random_bytes.h"

#include <sys/random.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status RandomBytes(void* out, size_t n) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    // getrandom returns at most 32 MiB per call, and may return less when interrupted.
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("getrandom(", n, " bytes)"));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace ferry
