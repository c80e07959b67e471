#!/bin/bash
# The Python package as a user installs it: a venv made with --system-site-packages (Debian's
# numpy), `pip install --no-build-isolation --no-deps` of the source tree (no network: no
# index is asked), then, from outside the tree, import, __version__, and a put/get through
# the installed package against a real agent this script starts and stops by pid.
#   python_package_test.sh BUILD_DIR SOURCE_DIR PYTHON FERRYD
# The compiled module comes from BUILD_DIR (setup.py's FERRY_BUILD_DIR), which `make test`
# has built for PYTHON; without it setup.py builds one with CMake (minutes).
set -euo pipefail
build=$1 src=$2 python=$3 ferryd=$4
# shellcheck source=tests/one_agent.sh
. "$(dirname "$0")/one_agent.sh"

"$python" -m venv --system-site-packages "$tmp/venv"
FERRY_BUILD_DIR=$build FERRY_PIP_BUILD=$tmp/pip \
  "$tmp/venv/bin/pip" install --no-build-isolation --no-deps --no-index "$src" \
  >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; fail "pip install"; }
tail -1 "$tmp/pip.log"
# The install left the checkout as it was (its work went to FERRY_PIP_BUILD).
[ ! -e "$src/ferry.egg-info" ] || fail "pip left ferry.egg-info in the source tree"

start_agent "$ferryd" py-package

version=$(sed -n 's/^project(ferry VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
cd "$tmp"
env -u PYTHONPATH "$tmp/venv/bin/python" - "$sock" "$version" "$tmp/venv" <<'PY' || fail "put/get"
import sys
import numpy as np
import ferry
sock, version, venv = sys.argv[1:]
assert ferry.__file__.startswith(venv), f"imported {ferry.__file__}, not the venv's"
assert ferry.__version__ == version, (ferry.__version__, version)
with ferry.Client(sock) as c:
    node = c.node
    target = c.alloc(1 << 20, name="py-package")
    src = c.alloc(1 << 20)
    x = src.numpy()
    x[:] = np.arange(1 << 20, dtype=np.uint32) * 7 % 251
    c.write(src, node, "py-package")                            # put
    back = c.alloc(1 << 20)
    back.numpy()[:] = 0
    c.read(back, node, "py-package", length=4096, offset=8192, remote_offset=4096)   # get
    assert bytes(back.numpy()[8192:12288]) == bytes(x[4096:8192])
    assert not back.numpy()[:8192].any()
print(f"ferry {ferry.__version__} from {ferry.__file__}: put/get verified")
PY
stop_agent
echo "PASS"
