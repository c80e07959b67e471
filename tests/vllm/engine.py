"""A small engine of the project's own (not vLLM's code) that calls FerryConnector in the
order vLLM's scheduler and model runner do, at the commit ferry/vllm/__init__.py pins:

  Scheduler.schedule (vllm/v1/core/sched/scheduler.py): for a waiting request, first
    _update_waiting_for_remote_kv if it is WAITING_FOR_REMOTE_KVS (not ready: skipped);
    with num_computed_tokens == 0, get_computed_blocks (the local prefix cache) then
    connector.get_num_new_matched_tokens(request, num_new_local_computed_tokens);
    allocate_slots; connector.update_state_after_alloc(request, blocks,
    num_external_computed_tokens) (every time, so twice for an async load); with
    load_kv_async the request waits in WAITING_FOR_REMOTE_KVS; at the end
    connector.build_connector_meta(scheduler_output).
  Scheduler.update_from_output: connector.update_connector_output(kv_connector_output),
    finished_recving -> finished_recving_kv_req_ids, finished_sending -> _free_blocks,
    invalid_block_ids -> recompute from the first failed block (kv_load_failure_policy
    "recompute"); a finished request -> _free_request -> connector.request_finished
    (delay_free_blocks: its blocks stay until finished_sending names it).
  The model runner's connector context (vllm/v1/worker/kv_connector_model_runner_mixin.py):
    bind_connector_metadata, start_load_kv, the forward (wait_for_layer_load and
    save_kv_layer per layer), wait_for_save, get_finished(finished_req_ids),
    get_block_ids_with_load_errors, clear_connector_metadata; the executor's
    KVOutputAggregator reports a request finished once every worker did.

Each engine is a scheduler process with N worker processes (fork), each worker a ferry
client of its engine's agent with its own paged KV cache (HND: (2, blocks, heads,
block_size, head_size) per layer, handed to the connector as vLLM's permuted (2, blocks,
block_size, heads, head_size) view), on `device`: "host" (torch CPU tensors after
share_memory_()), "sim" (buffers of the agent's simulated GPU cuda:<rank % gpus>, from
ferry.vllm.client(socket).empty) or "cuda" (torch CUDA tensors on cuda:<rank % gpus>). A layer's
value at a token is a function of the token, its position, the layer, K/V, the global head
and the dim, so any rank can check any block it holds."""

import collections
import multiprocessing
import os
import threading
import time
import traceback
import types

import torch

LAYERS, HEADS, HEAD_SIZE, BLOCK_SIZE, NUM_BLOCKS = 4, 4, 8, 4, 48
STATUS = types.SimpleNamespace(**{n: types.SimpleNamespace(name=n) for n in (
    "WAITING", "WAITING_FOR_REMOTE_KVS", "RUNNING", "PREEMPTED", "FINISHED_LENGTH_CAPPED",
    "FINISHED_ABORTED")})


def vllm_config(engine_id, tp, rank, socket, *, layers=LAYERS, kv_heads=HEADS,
                head_size=HEAD_SIZE, block_size=BLOCK_SIZE, dtype="float16",
                model="ferry-test/tiny", **extra):
    """The parts of a VllmConfig the connector reads: the harness's geometry unless given
    (bench/vllm_connector_bench.py gives its own); `extra`: kv_connector_extra_config keys."""
    model = types.SimpleNamespace(
        model=model, dtype=dtype, use_mla=False,
        get_num_layers=lambda pc: layers, get_total_num_kv_heads=lambda: kv_heads,
        get_head_size=lambda: head_size)
    return types.SimpleNamespace(
        model_config=model,
        cache_config=types.SimpleNamespace(block_size=block_size, cache_dtype="auto"),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tp, rank=rank),
        kv_transfer_config=types.SimpleNamespace(
            engine_id=engine_id, kv_role="kv_both",
            kv_connector_extra_config=dict(ferry_socket=socket, tp_rank=rank, **extra)))


def values(tokens, start, end, heads):
    """The KV of tokens[start:end] for global heads `heads`: (LAYERS, 2, len(heads), n, D)."""
    tok = torch.tensor(tokens[start:end], dtype=torch.int64)
    base = tok * 13 + torch.arange(start, end) * 11
    lay = torch.arange(LAYERS).view(-1, 1, 1, 1, 1) * 7
    kv = torch.arange(2).view(1, -1, 1, 1, 1) * 5
    hd = torch.tensor(heads).view(1, 1, -1, 1, 1) * 3
    dim = torch.arange(HEAD_SIZE).view(1, 1, 1, 1, -1)
    return ((base.view(1, 1, 1, -1, 1) + lay + kv + hd + dim) % 1999).to(torch.float16)


# --- the worker process ----------------------------------------------------------------------

def cache(engine_id, rank, layer, heads, socket, device, gpus):
    """One layer's zeroed KV cache, (2, NUM_BLOCKS, heads, BLOCK_SIZE, HEAD_SIZE) float16."""
    shape = (2, NUM_BLOCKS, heads, BLOCK_SIZE, HEAD_SIZE)
    if device == "host":
        return torch.zeros(shape, dtype=torch.float16).share_memory_()
    if device == "sim":  # the agent's memory: its buffer's name is what peers address
        import ferry.vllm
        t = ferry.vllm.client(socket).empty(shape, "float16", like="torch",
                                            device=f"cuda:{rank % gpus}",
                                            name=f"kv.{engine_id}.r{rank}.L{layer}")
        t.zero_()
        return t
    return torch.zeros(shape, dtype=torch.float16, device=f"cuda:{rank % gpus}")


class Worker:
    def __init__(self, engine_id, tp, rank, socket, extra):
        from ferry.vllm import FerryConnector, KVConnectorRole
        extra = dict(extra)
        device, gpus = extra.pop("device", "host"), extra.pop("gpus", 1)
        self.rank, self.heads = rank, list(range(rank * HEADS // tp, (rank + 1) * HEADS // tp))
        cfg = vllm_config(engine_id, tp, rank, socket, **extra)
        self.caches = {}
        for layer in range(LAYERS):
            raw = cache(engine_id, rank, layer, len(self.heads), socket, device, gpus)
            self.caches[f"model.layers.{layer}.self_attn"] = raw
        self.device = next(iter(self.caches.values())).device
        self.connector = FerryConnector(cfg, KVConnectorRole.WORKER)
        self.connector.register_kv_caches({n: t.permute(0, 1, 3, 2, 4)
                                           for n, t in self.caches.items()})
        self.step_calls = collections.Counter()

    def handshake(self):
        return self.connector.get_handshake_metadata()

    def _write(self, tokens, block_ids, start, end):
        if end <= start:
            return
        v = values(tokens, start, end, self.heads).permute(0, 3, 1, 2, 4)  # L, T, 2, H, D
        v = v.to(self.device)
        pos = torch.arange(start, end, device=self.device)
        blocks = torch.tensor(block_ids, device=self.device)[pos // BLOCK_SIZE]
        for layer, raw in enumerate(self.caches.values()):
            raw[:, blocks, :, pos % BLOCK_SIZE, :] = v[layer]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the agent reads it from another process

    def _check(self, tokens, block_ids):
        n = len(tokens)
        want = values(tokens, 0, n, self.heads).permute(0, 3, 1, 2, 4).to(self.device)
        pos = torch.arange(n, device=self.device)
        blocks = torch.tensor(block_ids, device=self.device)[pos // BLOCK_SIZE]
        bad = 0
        for layer, raw in enumerate(self.caches.values()):
            got = raw[:, blocks, :, pos % BLOCK_SIZE, :]
            bad += int((got != want[layer]).sum())
        return bad

    def execute(self, out):
        """One step, in the model runner's order."""
        c = self.connector
        t0 = time.perf_counter()
        c.bind_connector_metadata(out["meta"])
        c.start_load_kv(None)
        spent = time.perf_counter() - t0
        checked = {}
        for rid, tokens, block_ids, start, end, check in out["compute"]:
            for name in self.caches:
                c.wait_for_layer_load(name)
            self._write(tokens, block_ids, start, end)
            for name, raw in self.caches.items():
                c.save_kv_layer(name, raw, None)
            if check:
                checked[rid] = self._check(tokens, block_ids)
        t0 = time.perf_counter()
        c.wait_for_save()
        sending, recving = c.get_finished(out["finished_req_ids"])
        invalid = c.get_block_ids_with_load_errors()
        c.clear_connector_metadata()
        spent += time.perf_counter() - t0
        return dict(sending=sending or set(), recving=recving or set(), invalid=invalid,
                    checked=checked, connector_s=spent)

    def state(self):
        w = self.connector.connector_worker
        return dict(idle=w.idle(), stats=dict(w.stats), devices=[r.device for r in w._regs])

    def shutdown(self):
        """Shuts the connector down; the names of its threads still alive after (none: the
        start thread is joined, as every thread the connector started must be)."""
        self.connector.shutdown()
        return [t.name for t in threading.enumerate() if t.name.startswith("ferry-vllm")]


# --- the scheduler process -------------------------------------------------------------------

class Request:
    def __init__(self, rid, tokens, params, max_tokens):
        self.request_id, self.prompt_token_ids = rid, list(tokens)
        self.kv_transfer_params = params
        self.max_tokens, self.output = max_tokens, 0
        self.status, self.num_computed_tokens = STATUS.WAITING, 0
        self.block_ids, self.checked = [], False


class Blocks:
    """KVCacheBlocks' face for one KV group."""

    def __init__(self, ids, unhashed):
        self._ids, self._unhashed = list(ids), list(unhashed)

    def get_block_ids(self):
        return (list(self._ids),)

    def get_unhashed_block_ids(self):
        return list(self._unhashed)


class BlockPool:
    """Blocks with reference counts and a prefix cache (a full block's hash chains the
    tokens before it); a free cached block stays a hit until it is reused."""

    def __init__(self, n):
        self.free = collections.deque(range(n))
        self.ref = [0] * n
        self.cached, self.hash_of = {}, {}

    @staticmethod
    def hashes(tokens):
        h, out = None, []
        for i in range(len(tokens) // BLOCK_SIZE):
            h = hash((h, tuple(tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE])))
            out.append(h)
        return out

    def hits(self, tokens):
        hits = []
        for h in self.hashes(tokens[:len(tokens) - 1]):  # the last token is always computed
            if h not in self.cached:
                break
            hits.append(self.cached[h])
        return hits

    def allocate(self, hits, n_new):
        spare = len(self.free) - sum(1 for b in hits if self.ref[b] == 0)
        if spare < n_new:
            return None
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        new = []
        for _ in range(n_new):
            b = self.free.popleft()
            self.cached.pop(self.hash_of.pop(b, None), None)
            self.ref[b] = 1
            new.append(b)
        return new

    def cache(self, tokens, block_ids):
        for h, b in zip(self.hashes(tokens), block_ids):
            if h not in self.cached and b not in self.hash_of:
                self.cached[h], self.hash_of[b] = b, h

    def release(self, block_ids):
        for b in block_ids:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)

    def in_use(self):
        return sum(1 for r in self.ref if r)


class Engine:
    def __init__(self, engine_id, tp, socket, extra):
        from ferry.vllm import FerryConnector, KVConnectorRole
        self.tp = tp
        self.workers = [Remote(Worker, engine_id, tp, r, socket, extra) for r in range(tp)]
        self.connector = FerryConnector(vllm_config(engine_id, tp, 0, socket, **extra),
                                        KVConnectorRole.SCHEDULER)
        hs = gather(self.workers, "handshake")
        self.connector.set_xfer_handshake_metadata(dict(enumerate(hs)))
        self.pool = BlockPool(NUM_BLOCKS)
        self.requests, self.waiting, self.running = {}, [], []
        self.finished_req_ids, self.finished_recving, self.failed_blocks = set(), set(), set()
        self.outputs, self.hold = {}, False
        self.counts = collections.defaultdict(collections.Counter)
        self.log = collections.Counter()
        self.connector_s = []
        self.aggregated = collections.Counter()

    def add_request(self, rid, tokens, params, max_tokens):
        r = Request(rid, tokens, params, max_tokens)
        self.requests[rid] = r
        self.waiting.append(r)
        self.connector.on_new_request(r)

    def set_hold(self, hold):
        self.hold = hold  # no waiting request is scheduled (a full engine)

    def abort(self, rid):
        r = self.requests[rid]
        if r in self.waiting:
            self.waiting.remove(r)
        if r in self.running:
            self.running.remove(r)
        r.status = STATUS.FINISHED_ABORTED
        self._free_request(r)

    def preempt(self, rid):
        r = self.requests[rid]
        self.running.remove(r)
        self.pool.release(r.block_ids)
        r.block_ids, r.num_computed_tokens, r.status = [], 0, STATUS.PREEMPTED
        r.checked = False
        self.waiting.insert(0, r)
        self.log["preempted"] += 1

    def _update_waiting_for_remote_kv(self, r):
        if r.request_id not in self.finished_recving:
            return False
        self.finished_recving.discard(r.request_id)
        failed = [i for i, b in enumerate(r.block_ids) if b in self.failed_blocks]
        n = len(r.prompt_token_ids)
        if failed:  # recompute from the first failed block
            self.failed_blocks -= set(r.block_ids)
            r.num_computed_tokens = min(r.num_computed_tokens, failed[0] * BLOCK_SIZE)
            self.log["recomputed_after_load_error"] += 1
            if r.num_computed_tokens == 0:
                # Nothing valid: vLLM frees the request's blocks (kv_cache_manager.free) and
                # schedules it as a new one, which may hit the prefix cache again.
                self.pool.release(r.block_ids)
                r.block_ids = []
        else:
            r.num_computed_tokens = n - 1
        r.status = STATUS.WAITING
        return True

    def schedule(self):
        compute = []
        for r in self.running:  # one decode token each (its KV is not modelled)
            compute.append((r.request_id, r.prompt_token_ids, r.block_ids, 0, 0, False))
        for r in list(self.waiting):
            if self.hold:
                break
            if r.status is STATUS.WAITING_FOR_REMOTE_KVS:
                if not self._update_waiting_for_remote_kv(r):
                    continue
            n = len(r.prompt_token_ids)
            ext, load_async, hits = 0, False, []
            if r.num_computed_tokens == 0:
                hits = self.pool.hits(r.prompt_token_ids)
                local = len(hits) * BLOCK_SIZE
                ext, load_async = self.connector.get_num_new_matched_tokens(r, local)
                again = self.connector.get_num_new_matched_tokens(r, local)
                assert again == (ext, load_async), "get_num_new_matched_tokens has effects"
                r.num_computed_tokens = local + ext
                need = -(-n // BLOCK_SIZE) - len(hits)
                new = self.pool.allocate(hits, need)
                if new is None:
                    r.num_computed_tokens = 0
                    break
                r.block_ids = hits + new
                unhashed = new
            else:
                unhashed = []
            self.counts[r.request_id]["update_state_after_alloc"] += 1
            self.connector.update_state_after_alloc(r, Blocks(r.block_ids, unhashed), ext)
            if load_async:
                r.status = STATUS.WAITING_FOR_REMOTE_KVS
                continue
            self.waiting.remove(r)
            r.status = STATUS.RUNNING
            self.running.append(r)
            start = r.num_computed_tokens
            compute.append((r.request_id, r.prompt_token_ids, r.block_ids, start, n,
                            not r.checked))
            r.checked = True
        out = dict(compute=compute, finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        out["meta"] = self.connector.build_connector_meta(out)
        return out

    def step(self):
        out = self.schedule()
        results = gather(self.workers, "execute", out)
        self.connector_s.append(max(x["connector_s"] for x in results))
        agg = self.aggregated  # KVOutputAggregator: counts carry over steps
        for x in results:
            for rid in x["sending"]:
                agg[("s", rid)] += 1
            for rid in x["recving"]:
                agg[("r", rid)] += 1
            self.failed_blocks |= x["invalid"]
            for rid, bad in x["checked"].items():
                self.log["checked"] += 1
                self.log["bad_values"] += bad
        sending = {rid for (k, rid), c in agg.items() if k == "s" and c == self.tp}
        recving = {rid for (k, rid), c in agg.items() if k == "r" and c == self.tp}
        for rid in sending:
            del agg[("s", rid)]
        for rid in recving:
            del agg[("r", rid)]
        self.log["load_error_blocks"] += len(set().union(*(x["invalid"] for x in results)))
        self.connector.update_connector_output(types.SimpleNamespace(
            finished_sending=sending, finished_recving=recving))
        self.finished_recving |= recving
        for rid in sending:  # _free_blocks
            self.pool.release(self.requests[rid].block_ids)
            self.log["freed_after_send"] += 1
        for r in list(self.running):
            n = len(r.prompt_token_ids)
            r.num_computed_tokens = n
            self.pool.cache(r.prompt_token_ids, r.block_ids)
            r.output += 1
            if r.output >= r.max_tokens:
                self.running.remove(r)
                r.status = STATUS.FINISHED_LENGTH_CAPPED
                self._free_request(r)
        return len(self.waiting) + len(self.running)

    def _free_request(self, r):
        self.counts[r.request_id]["request_finished"] += 1
        delay, params = self.connector.request_finished(r, list(r.block_ids))
        self.outputs[r.request_id] = params
        if not delay:
            self.pool.release(r.block_ids)
        self.finished_req_ids.add(r.request_id)

    def output(self, rid):
        return self.outputs.get(rid)

    def request_state(self, rid):
        r = self.requests[rid]
        return r.status.name, dict(self.counts[rid])

    def state(self):
        return dict(in_use=self.pool.in_use(), waiting=len(self.waiting),
                    running=len(self.running), log=dict(self.log),
                    workers=gather(self.workers, "state"),
                    connector_s_max=max(self.connector_s, default=0))

    def shutdown(self):
        left = gather(self.workers, "shutdown")
        for w in self.workers:
            w.close()
        return [name for names in left for name in names]


# --- processes -------------------------------------------------------------------------------

def _serve(conn, cls, args):
    try:
        obj = cls(*args)
        conn.send((True, None))
    except BaseException:  # noqa: B902 - the parent raises it
        conn.send((False, traceback.format_exc()))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            return
        name, a = msg
        try:
            conn.send((True, getattr(obj, name)(*a)))
        except BaseException:  # noqa: B902
            conn.send((False, traceback.format_exc()))


class Remote:
    """An object in a child process (fork), called by name."""

    def __init__(self, cls, *args, timeout=60):
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, cls, args))
        self.process.start()
        self._wait(timeout)

    def _wait(self, timeout):
        if not self.conn.poll(timeout):
            raise TimeoutError(f"process {self.process.pid} did not answer in {timeout} s")
        ok, value = self.conn.recv()
        if not ok:
            raise RuntimeError(value)
        return value

    def send(self, name, *args):
        self.conn.send((name, args))

    def call(self, name, *args, timeout=60):
        self.send(name, *args)
        return self._wait(timeout)

    def close(self):
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(10)
        if self.process.is_alive():
            os.kill(self.process.pid, 9)
            self.process.join()


def gather(remotes, name, *args, timeout=60):
    for r in remotes:
        r.send(name, *args)
    return [r._wait(timeout) for r in remotes]


class Probe:
    """The test's own ferry client calls, in a child process: gRPC does not survive fork,
    so the process that forks the engines never makes a ferry client itself."""

    def wait_empty(self, sockets, seconds=5):
        import ferry
        for s in sockets:
            c = ferry.Client(s)
            end = time.monotonic() + seconds
            while True:
                info = c.info()
                if (info["registered_bytes"] == 0 and info["block_lists"] == 0
                        and info["host_pool_used_bytes"] == 0 and info["buffer_count"] == 0):
                    break
                if time.monotonic() > end:
                    return f"{info['node']} still holds: {info}"
                time.sleep(0.05)
            c.close()
        return None

    def ring(self, socket, peer, remote_list, notifications):
        """Notifications (name, payload) to the owner of `peer`'s list `remote_list`, each
        sent alone (Client.notify)."""
        import ferry
        c = ferry.Client(socket)
        for name, payload in notifications:
            c.notify(peer, remote_list, name, payload, timeout=5)
        c.close()

    def cuda(self):
        """(GPU count, why none) as torch sees it, asked here: a process that forks CUDA
        workers must not have initialised CUDA itself."""
        if not torch.cuda.is_available():
            return 0, f"torch {torch.__version__} sees no CUDA GPU"
        return torch.cuda.device_count(), ""

    def answers(self, socket):
        import ferry
        try:
            ferry.Client(socket, timeout=1).info()
            return True
        except ferry.Error:
            return False
