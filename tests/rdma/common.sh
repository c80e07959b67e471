# Shared by the tests/rdma scripts (sourced, not run): where the guest cache lives, logging,
# and skipping with a reason. The scripts run as root on a Debian 12 host (CI's machine).

# The guest (kernel, initramfs, rootfs) is built once and kept here, keyed by the versions
# of the packages it is made of (build-guest).
FERRY_RDMA_CACHE=${FERRY_RDMA_CACHE:-/var/cache/ferry-rdma}
RDMA_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC_DIR=$(cd "$RDMA_DIR/../.." && pwd)

log() { echo "test-rdma: $*" >&2; }
die() { echo "test-rdma: error: $*" >&2; exit 1; }

# A skip is a success with its reason printed: CI machines without qemu, the kernel package
# or root cannot run a guest, and that is not a failure of ferry.
skip() {
  echo "test-rdma: SKIPPED: $*"
  exit 0
}
