"""A client of another uid than the agent's (issue 44 row 11): ferry.empty and alloc work,
since the agent lends each buffer's own file over its fd socket (before, mapping failed:
PERMISSION_DENIED open(/proc/<agent pid>/fd/N)). The child drops from root to nobody; the
test skips where it cannot."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

import ferry

NOBODY = 65534

CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    import ferry
    c = ferry.Client(sys.argv[1])
    x = c.empty((1 << 18,), "float32")            # 1 MiB in an agent buffer, mapped here
    x[:] = np.arange(1 << 18, dtype=np.float32)
    src = c.alloc(1 << 20)
    src.numpy("float32", (1 << 18,))[:] = x
    landing = c.alloc(1 << 20, name="py-landing")
    back = c.alloc(1 << 20)
    c.write(src, c.node, "py-landing")
    c.read(back, c.node, "py-landing")
    same = (np.array_equal(landing.numpy("float32", (1 << 18,)), x) and
            np.array_equal(back.numpy("float32", (1 << 18,)), x))
    print("uid", os.getuid(), "verified", same)
""")


def _drop_to_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the client drops to uid 65534")
def test_a_client_of_another_uid_maps_what_it_allocates():
    with ferry.launch.agents(["node-u"], host_pool="64MiB", local_mode="0666") as agents:
        agent = agents["node-u"]
        os.chmod(os.path.dirname(agent.socket), 0o755)  # nobody must reach the socket
        env = dict(os.environ)
        run = subprocess.run([sys.executable, "-c", CHILD, agent.socket], env=env,
                             preexec_fn=_drop_to_nobody, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr
        assert f"uid {NOBODY} verified True" in run.stdout, run.stdout + run.stderr
        # Its session ended with it: every buffer it had is freed.
        with ferry.Client(agent.socket) as root:
            deadline = time.monotonic() + 10
            while root.info()["host_pool_used_bytes"] != 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert root.info()["host_pool_used_bytes"] == 0
