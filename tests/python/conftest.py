"""Two real agents for the whole pytest session (ferry.launch stops them at the end)."""
import pytest

import ferry


@pytest.fixture(scope="session")
def nodes():
    sim_gpu = "gpu:\n  backend: sim\n  count: 1\n  pool_size: 64MiB\n"
    with ferry.launch.agents(["node-a", "node-b"], host_pool="1GiB", extra=sim_gpu) as agents:
        yield agents


@pytest.fixture(scope="session")
def a(nodes):
    with ferry.Client(nodes["node-a"].socket) as c:
        yield c


@pytest.fixture(scope="session")
def b(nodes):
    with ferry.Client(nodes["node-b"].socket) as c:
        yield c
