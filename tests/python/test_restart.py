"""An agent restart survived: the client reconnects by itself and says once what was lost.

Before, after ferryd restarted the client got "Broken pipe", then "session 7 is not open", its
registrations and lists were silently gone, and a peer heard only "no block list named 'kv'".
"""
import signal
import subprocess
import time
from multiprocessing import shared_memory

import numpy as np
import pytest

import ferry
from ferry import launch

BLOCK = 4096


def restart(agent):
    """Kills `agent` (SIGKILL, by pid) and starts it again on the same config and socket."""
    agent.process.send_signal(signal.SIGKILL)
    agent.process.wait(timeout=10)
    with open(agent.log, "a") as log:
        agent.process = subprocess.Popen([launch._ferryd(), "--config", agent.config],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)


@pytest.fixture
def pair():
    with launch.agents(["node-r", "node-s"], host_pool="256MiB") as agents:
        yield agents


def shared_array(nbytes):
    shm = shared_memory.SharedMemory(create=True, size=nbytes)
    arr = np.ndarray((nbytes,), dtype=np.uint8, buffer=shm.buf)
    return shm, arr


def test_restart_raises_agent_restarted_once_and_the_client_works_again(pair):
    r, s = pair["node-r"], pair["node-s"]
    shm, kv = shared_array(8 * BLOCK)
    kv[:] = np.arange(kv.size, dtype=np.uint64).astype(np.uint8)
    with ferry.Client(r.socket, timeout=20) as c, ferry.Client(s.socket) as peer:
        reg = c.register(kv, name="kv-mem")
        bl = c.prepare_blocks([reg], BLOCK, name="kv")
        buf = c.alloc(BLOCK)
        old_session = c._s.raw.id
        local = peer.alloc(4 * BLOCK)
        local_bl = peer.prepare_blocks([local], BLOCK)
        peer.read_blocks("node-r", "kv", [0, 1], local_bl, [0, 1], wait=True).wait(10)
        assert bytes(memoryview(local.raw)[:BLOCK]) == kv[:BLOCK].tobytes()

        restart(r)
        # The first call after the restart says so, once, with what was lost.
        with pytest.raises(ferry.AgentRestarted) as raised:
            c.alloc(BLOCK)
        e = raised.value
        assert isinstance(e, ferry.Unavailable) and e.code_name == "UNAVAILABLE"
        assert e.lost["registrations"] == ["kv-mem"]
        assert e.lost["lists"] == ["kv"]
        assert buf.id in e.lost["buffers"]
        assert "restarted" in str(e) and "kv-mem" in str(e)

        # Later calls work, on a new session of the new run.
        assert c._s.raw.id != old_session
        new_buf = c.alloc(BLOCK)
        new_reg = c.register(kv, name="kv-mem")
        new_bl = c.prepare_blocks([new_reg], BLOCK, name="kv")
        assert c.info()["block_lists"] == 1

        # The old session's objects refuse, naming the restart; they touch nothing new.
        with pytest.raises(ferry.FailedPrecondition, match="restarted"):
            c.deregister(reg)
        with pytest.raises(ferry.FailedPrecondition, match="restarted"):
            bl.release()
        with pytest.raises(ferry.FailedPrecondition, match="restarted"):
            c.prepare_blocks([reg], BLOCK)
        with pytest.raises(ferry.FailedPrecondition, match="restarted"):
            c.write_blocks(bl, [0], "node-s", "nothing", [0])
        with pytest.raises(ferry.FailedPrecondition, match="restarted"):
            c.write(buf, "node-s", "nothing", BLOCK)
        with pytest.raises(ferry.FailedPrecondition, match="restarted|not open"):
            buf.free()  # an old session's id: refused, not the new run's buffer freed
        assert new_buf.id in [b.id for b in c.list_buffers()]
        assert c.info()["block_lists"] == 1

        # The peer hears that node-r restarted, not only that the list is missing... once
        # the list is gone: release the new one and ask.
        new_bl.release()
        with pytest.raises(ferry.NotFound, match=r"node-r restarted \d+ s ago.*no block list "
                                                 r"named 'kv'"):
            peer.read_blocks("node-r", "kv", [0], local_bl, [0], wait=True).wait(10)
        new_buf.free()
        c.deregister(new_reg)
    shm.close()
    shm.unlink()


def test_an_agent_that_does_not_come_back_is_unavailable_then_restarted(pair):
    r = pair["node-r"]
    with ferry.Client(r.socket, timeout=1) as c:
        c.alloc(BLOCK)
        r.process.send_signal(signal.SIGKILL)
        r.process.wait(timeout=10)
        with pytest.raises(ferry.Unavailable) as raised:
            c.alloc(BLOCK)
        assert not isinstance(raised.value, ferry.AgentRestarted)
        assert "went away" in str(raised.value)
        restart(r)
        deadline = time.monotonic() + 20
        while True:
            try:
                c.alloc(BLOCK)
                pytest.fail("the first call after the agent came back did not say so")
            except ferry.AgentRestarted:
                break
            except ferry.Unavailable:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert c.alloc(BLOCK).size == BLOCK


def test_threads_calling_across_a_restart_see_agent_restarted_once(pair):
    import threading
    r = pair["node-r"]
    with ferry.Client(r.socket, timeout=20) as c:
        c.alloc(BLOCK)
        restart(r)
        seen, errors = [], []
        go = threading.Barrier(4)

        def caller():
            go.wait()
            for _ in range(200):
                try:
                    c.alloc(BLOCK)
                    return
                except ferry.AgentRestarted as e:
                    seen.append(e)
                except ferry.Unavailable:
                    time.sleep(0.01)  # raced the reconnect: try again
                except Exception as e:  # noqa: B902 - any other failure fails the test
                    errors.append(e)
                    return
            errors.append("no call succeeded after the restart")

        threads = [threading.Thread(target=caller) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [] and len(seen) == 1
