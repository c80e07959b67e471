"""FerryConnector between a prefill and a decode engine (tests/vllm/engine.py drives it in
vLLM's call order), each engine with its own ferryd, talking tcp over loopback. Every
case checks every pulled value on every decode rank; each configuration ends with no block
in use on either engine, nothing leased or in flight in any connector, and both agents
back to zero registrations, lists and pool bytes. The KV caches are torch CPU tensors in
shared memory, or buffers of the agents' simulated GPUs (test_sim_gpu_caches), or CUDA
tensors (test_cuda_caches: tests/gpu/run.sh, where there is a GPU)."""
import json
import signal
import subprocess
import time

import pytest

import ferry.launch
from ferry.vllm import metadata, tp_mapping

import engine as eng
from engine import Remote

LEASE = 2.0


SIM_GPUS = 4  # each worker's cache on simulated GPU rank % 4


@pytest.fixture(scope="module")
def nodes():
    with ferry.launch.agents(["prefill-node", "decode-node"], host_pool="64MiB") as agents:
        yield agents


@pytest.fixture(scope="module")
def sim_nodes():
    sim = f"gpu:\n  backend: sim\n  count: {SIM_GPUS}\n  pool_size: 8MiB\n"
    with ferry.launch.agents(["sim-prefill", "sim-decode"], host_pool="64MiB",
                             extra=sim) as agents:
        yield agents


class Pair:
    def __init__(self, nodes, P, D, tag, prefill_node="prefill-node",
                 decode_node="decode-node", **extra):
        self.nodes = nodes
        self.prefill = Remote(eng.Engine, f"P{tag}", P, nodes[prefill_node].socket,
                              dict(lease_s=LEASE, pull_timeout_s=5, **extra))
        self.decode = Remote(eng.Engine, f"D{tag}", D, nodes[decode_node].socket,
                             dict(lease_s=LEASE, heartbeat_s=0.3, pull_timeout_s=5, **extra))

    def prefill_request(self, rid, tokens):
        self.prefill.call("add_request", rid, tokens, {"do_remote_decode": True}, 1)
        for _ in range(20):
            self.prefill.call("step")
            params = self.prefill.call("output", rid)
            if params is not None:
                return params
        raise AssertionError(f"prefill of {rid} did not finish")

    def run(self, rid, tokens, params=None, steps=200, between=None):
        """Prefill then decode one request (the proxy passes the params); returns the
        decode request's (status, connector call counts)."""
        params = params or self.prefill_request(rid, tokens)
        if between:
            params = between(params) or params
        self.decode.call("add_request", "d-" + rid, tokens, params, 2)
        for _ in range(steps):
            left = self.decode.call("step")
            self.prefill.call("step")
            if not left:
                return self.decode.call("request_state", "d-" + rid)
            time.sleep(0.002)
        raise AssertionError(f"decode of {rid} hangs: {self.decode.call('state')}")

    def drain(self, seconds=LEASE + 3):
        """Steps both engines until nothing is in use, leased or in flight."""
        end = time.monotonic() + seconds
        while True:
            self.prefill.call("step")
            self.decode.call("step")
            p, d = self.prefill.call("state"), self.decode.call("state")
            idle = all(w["idle"] for w in p["workers"] + d["workers"])
            if idle and p["in_use"] == 0 and d["in_use"] == 0:
                return p, d
            assert time.monotonic() < end, f"still held: prefill {p} decode {d}"
            time.sleep(0.02)

    def close(self):
        left = []
        for e in (self.prefill, self.decode):
            try:
                left += e.call("shutdown")
            finally:
                e.close()
        assert not left, f"connector threads left running after shutdown: {left}"


def tokens(seed, n):
    return [(seed * 7919 + i * 104729) % 50000 for i in range(n)]


def probe(name, *args):
    p = Remote(eng.Probe)
    try:
        return p.call(name, *args)
    finally:
        p.close()


def agents_empty(nodes):
    why = probe("wait_empty", [a.socket for a in nodes.values()])
    assert why is None, why


def checked_clean(pair, p, d, load_errors=0):
    assert d["log"].get("bad_values", 0) == 0, d["log"]
    assert d["log"].get("load_error_blocks", 0) == load_errors, d["log"]


def test_tp_mapping_covers_every_head_once():
    for P, D in [(1, 1), (2, 4), (4, 2), (1, 4), (4, 1), (2, 2)]:
        H = 8
        seen = {}
        for d in range(D):
            for rd in tp_mapping.reads(d, D, P, mla=False):
                width = H // P // rd.remote_split
                first = rd.prefill_rank * (H // P) + rd.remote_slice * width
                local_first = d * (H // D) + rd.local_slice * (H // D // rd.local_split)
                for h in range(width):
                    assert first + h == local_first + h
                    seen[first + h] = seen.get(first + h, 0) + 1
        assert seen == {h: 1 for h in range(H)}, (P, D, seen)
        counts = {}
        for d in range(D):
            for p in tp_mapping.notified(d, D, P):
                counts[p] = counts.get(p, 0) + 1
        assert counts == {p: tp_mapping.expected_notifications(D, P) for p in range(P)}
    # MLA: every prefill rank hears from its decode ranks though not all are read.
    assert [r.prefill_rank for d in range(2) for r in tp_mapping.reads(d, 2, 4, True)] == [0, 2]
    assert tp_mapping.check_sizes(3, 2, 8, False) is not None


def test_notifications_round_trip():
    prefix = metadata.notify_prefix("vllm.P.1.r0", 3)
    assert prefix == "ferry.vllm/P.1/p3/"
    assert metadata.parse(prefix, *metadata.done(prefix, "a/b", 2, 4)) == [("a/b", 2, 4)]
    (name, payload), = metadata.heartbeats(prefix, ["x", "y/z"])
    assert metadata.parse(prefix, name, payload) == [("x", None, 0), ("y/z", None, 0)]
    # Many requests: as few heartbeats as fit the agent's 4 KiB payload, none bigger.
    rids = [f"cmpl-{i:08d}-{'x' * 40}" for i in range(300)]
    beats = metadata.heartbeats(prefix, rids)
    assert 1 < len(beats) <= 6 and all(len(p) <= 4096 for _, p in beats)
    assert [r for n, p in beats for r, _, _ in metadata.parse(prefix, n, p)] == rids
    for name, payload in [(prefix + "garbage", b""), (prefix + "done", b"{not json"),
                          (prefix + "done", b'{"req": "a", "rank": -1, "of": 1}'),
                          (prefix + "hb", b'{"reqs": [1]}'), ("elsewhere/done", b"{}")]:
        assert metadata.parse(prefix, name, payload) is None, (name, payload)


@pytest.mark.parametrize("P,D", [(1, 1), (2, 4), (4, 2)])
def test_pull_hits_abort_preemption(nodes, P, D):
    pair = Pair(nodes, P, D, f"{P}{D}")
    try:
        # A whole prompt (6 blocks and a partial one), every value checked on every rank.
        state, calls = pair.run("a", tokens(1, 27))
        assert state == "FINISHED_LENGTH_CAPPED"
        assert calls == {"update_state_after_alloc": 2, "request_finished": 1}
        # Partial prefix hit: the first 3 blocks are decode's own, the rest is pulled.
        pair.run("b", tokens(1, 12) + tokens(2, 13))
        # Full prefix hit: every full block local, only the tail is pulled.
        pair.run("c", tokens(1, 27))
        # Abort before scheduling: decode never pulls, prefill frees on decode's word.
        params = pair.prefill_request("e", tokens(3, 9))
        pair.decode.call("add_request", "d-e", tokens(3, 9), params, 2)
        pair.decode.call("abort", "d-e")
        # Preemption after the load: recomputed locally, never pulled twice.
        params = pair.prefill_request("f", tokens(4, 10))
        pair.decode.call("add_request", "d-f", tokens(4, 10), params, 3)
        for _ in range(100):
            pair.decode.call("step")
            pair.prefill.call("step")
            if pair.decode.call("request_state", "d-f")[0] == "RUNNING":
                break
        pair.decode.call("preempt", "d-f")
        for _ in range(20):
            if not pair.decode.call("step"):
                break
        p, d = pair.drain()
        checked_clean(pair, p, d)
        assert d["log"]["preempted"] == 1 and d["log"]["checked"] >= 5
        stats = [w["stats"] for w in d["workers"]]
        assert sum(s["notify_only"] for s in stats) == D  # the abort only
        freed = sum(w["stats"]["freed_by_notify"] for w in p["workers"])
        assert freed == 5 * P and p["log"]["freed_after_send"] == 5
        assert all(w["stats"]["freed_by_lease"] == 0 for w in p["workers"])
    finally:
        pair.close()
    agents_empty(nodes)


def test_leases_notifications_and_compat(nodes):
    pair = Pair(nodes, 2, 2, "L")
    try:
        # Lease expiry: decode never hears of the request; prefill frees after the lease.
        pair.prefill_request("lost", tokens(5, 9))
        # Heartbeats: decode holds two requests (a full engine) for longer than the lease;
        # its heartbeats (one per prefill rank, naming both) keep prefill's blocks, then it
        # pulls and every value checks.
        params = pair.prefill_request("held", tokens(6, 11))
        params2 = pair.prefill_request("held2", tokens(16, 13))
        pair.decode.call("set_hold", True)
        pair.decode.call("add_request", "d-held", tokens(6, 11), params, 1)
        pair.decode.call("add_request", "d-held2", tokens(16, 13), params2, 1)
        end = time.monotonic() + LEASE * 1.6
        while time.monotonic() < end:
            pair.decode.call("step")
            pair.prefill.call("step")
            time.sleep(0.02)
        pair.decode.call("set_hold", False)
        for _ in range(100):
            if not pair.decode.call("step"):
                break
            pair.prefill.call("step")
        # Duplicate and unknown notifications, from a third client of decode's agent.
        prefix = metadata.notify_prefix("vllm.PL.r0", 0)
        probe("ring", nodes["decode-node"].socket, "prefill-node", "vllm.PL.r0.x1",
              [metadata.done(prefix, "held", 0, 1),            # a duplicate
               metadata.done(prefix, "nobody", 0, 1),          # an unknown request
               (prefix + "garbage", b""),                       # not ours
               (prefix + "done", json.dumps({"req": 7}).encode())])  # ours, but malformed
        # Compatibility hash mismatch: decode recomputes, prefill still frees at once.
        def tamper(params):
            params = dict(params, compat_hash="0" * 32)
            params["geometry"] = dict(params["geometry"], model="another/model")
            return params
        pair.run("mismatch", tokens(7, 10), between=tamper)
        p, d = pair.drain(LEASE * 3)
        checked_clean(pair, p, d)
        pw = [w["stats"] for w in p["workers"]]
        assert sum(s["freed_by_lease"] for s in pw) == 2            # "lost", both ranks
        assert sum(s["freed_by_notify"] for s in pw) == 6  # "held", "held2", "mismatch"
        assert pw[0]["duplicates"] + pw[0]["unknown"] >= 2
        for w in d["workers"]:  # a heartbeat renews both held requests at once
            assert 2 <= w["stats"]["heartbeats"] < w["stats"]["renewed"], w["stats"]
        assert d["log"]["checked"] == 6  # three requests, two ranks
    finally:
        pair.close()
    agents_empty(nodes)


def _restart(agent):
    ferry.launch._stop(agent)
    with open(agent.log, "a") as log:
        agent.process = subprocess.Popen([ferry.launch._ferryd(), "--config", agent.config],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
    end = time.monotonic() + 15
    while not probe("answers", agent.socket):
        assert time.monotonic() < end, agent.log_text()[-2000:]
        time.sleep(0.05)


def test_prefill_agent_killed_mid_pull(nodes):
    """SIGKILL of prefill's agent once prefill offered a request: decode's pull fails, its
    blocks are reported and recomputed (every value checks), nothing hangs; prefill's
    connector waits out its agent, and once it is back it serves the next request."""
    pair = Pair(nodes, 1, 1, "K")
    try:
        pair.run("before", tokens(8, 20))
        agent = nodes["prefill-node"]

        def kill(params):
            agent.process.send_signal(signal.SIGKILL)
            agent.process.wait()
        started = time.monotonic()
        state, _ = pair.run("killed", tokens(9, 21), between=kill)
        assert state == "FINISHED_LENGTH_CAPPED" and time.monotonic() - started < 15
        d = pair.decode.call("state")
        assert d["log"]["load_error_blocks"] == 6, d["log"]  # 21 tokens: 6 blocks, all
        assert d["log"]["recomputed_after_load_error"] == 1 and d["log"]["bad_values"] == 0
        assert d["in_use"] == 0, d  # the failed request's blocks went back to the pool
        _restart(agent)
        pair.run("after", tokens(10, 22))
        p, d = pair.drain(LEASE * 3)
        assert d["log"]["bad_values"] == 0 and d["log"]["checked"] == 3
        ps = p["workers"][0]["stats"]
        assert ps["restarts"] == 1, ps
        # "killed": decode's word died with the agent, the lease freed the blocks.
        assert ps["freed_by_notify"] == 2 and ps["freed_by_lease"] == 1, ps
    finally:
        pair.close()
    agents_empty(nodes)


def test_agent_restarted_between_requests(nodes):
    """Both agents restart between two requests (TP 2 -> 2): each connector hears
    AgentRestarted once, registers and exports again, and the next pull moves every value."""
    pair = Pair(nodes, 2, 2, "R")
    try:
        pair.run("first", tokens(11, 19))
        pair.drain()
        _restart(nodes["prefill-node"])
        _restart(nodes["decode-node"])
        state, _ = pair.run("second", tokens(12, 23))
        assert state == "FINISHED_LENGTH_CAPPED"
        p, d = pair.drain()
        assert d["log"].get("load_error_blocks", 0) == 0 and d["log"]["bad_values"] == 0
        assert d["log"]["checked"] == 4  # two requests, two ranks
        assert [w["stats"]["restarts"] for w in p["workers"] + d["workers"]] == [1] * 4
        assert sum(w["stats"]["freed_by_notify"] for w in p["workers"]) == 4
    finally:
        pair.close()
    agents_empty(nodes)


@pytest.mark.parametrize("P,D", [(1, 1), (2, 4)])
def test_sim_gpu_caches(sim_nodes, P, D):
    """The KV caches in the agents' simulated GPU memory (ferry.vllm.client(socket).empty(...,
    device="cuda:N")): lists over GPU buffers, pulls GPU -> GPU, every value checked."""
    pair = Pair(sim_nodes, P, D, f"S{P}{D}", prefill_node="sim-prefill",
                decode_node="sim-decode", device="sim", gpus=SIM_GPUS)
    try:
        pair.run("a", tokens(13, 27))
        pair.run("b", tokens(13, 12) + tokens(14, 13))  # a partial prefix hit
        p, d = pair.drain()
        checked_clean(pair, p, d)
        assert d["log"]["checked"] == 2 * D
        assert sum(w["stats"]["pulls"] for w in d["workers"]) == 2 * max(P, D)
        # Registered as what they are: each rank's layers on its simulated GPU.
        for e, tp in ((p, P), (d, D)):
            assert [w["devices"] for w in e["workers"]] == [
                [f"cuda:{r % SIM_GPUS}"] * eng.LAYERS for r in range(tp)]
    finally:
        pair.close()
    agents_empty(sim_nodes)


@pytest.fixture(scope="module")
def cuda_nodes():
    gpus, why = probe("cuda")
    if not gpus:
        pytest.skip(why)
    gpu = "gpu:\n  backend: cuda\n  pool_size: 64MiB\n"
    with ferry.launch.agents(["cuda-prefill", "cuda-decode"], host_pool="64MiB",
                             extra=gpu) as agents:
        yield agents, gpus


@pytest.mark.parametrize("P,D", [(1, 1), (1, 2)])
def test_cuda_caches(cuda_nodes, P, D):
    """The KV caches are CUDA torch tensors (vLLM's own memory) on cuda:<rank % GPUs>,
    registered by CUDA IPC; every pulled value checked on the GPU (tests/gpu/run.sh)."""
    cuda_nodes, gpus = cuda_nodes
    pair = Pair(cuda_nodes, P, D, f"C{P}{D}", prefill_node="cuda-prefill",
                decode_node="cuda-decode", device="cuda", gpus=gpus)
    try:
        pair.run("a", tokens(15, 27))
        pair.run("b", tokens(15, 12) + tokens(16, 13))
        p, d = pair.drain()
        checked_clean(pair, p, d)
        assert d["log"]["checked"] == 2 * D
        for e, tp in ((p, P), (d, D)):
            assert [w["devices"] for w in e["workers"]] == [
                [f"cuda:{r % gpus}"] * eng.LAYERS for r in range(tp)]
    finally:
        pair.close()
    agents_empty(cuda_nodes)
