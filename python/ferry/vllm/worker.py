"""The worker side of FerryConnector: one per TP rank, in the model runner's process.

Every rank registers its layer tensors with its node's agent (one registration each) and
exports one block list over them, "<base>.x1" (plane t = layer * planes + K/V, block b is
index t * num_blocks + b), the same list cut in k for the decode ranks of a larger TP
("<base>.x<k>", ferry/vllm/tp_mapping.py). Decode ranks pull (read_blocks, one call per
prefill rank they read, with a notification) and send the notifications that go without a
pull ("done" with nothing to read, heartbeats) alone with client.notify, addressed to the
prefill rank's "<base>.x1" (whose owner takes them); prefill ranks take their
notifications with one poll_notifications per step and free a request's blocks once every
decode rank that reads them said so, or when its lease (renewed by decode's heartbeats)
runs out.

The ranks of a process share one ferry.Client per agent (client()): memory a caller
allocated there (ferry.empty(..., device="cuda:N", client=client(socket)), a simulated
GPU's KV cache) is that client's to register. When the agent restarts, the client raises
ferry.AgentRestarted once and runs on a new session; the worker registers and exports
everything again on it (the old run's registrations and lists are gone).

start_load_kv returns at once: a decode rank's reads, notifications and heartbeats go from
its own thread ("ferry-vllm-start", one per WorkerSide, fed by a queue), since a read of 8192
pairs takes the agent 12-44 ms to plan (bench/results/2026-12-07-vllm-connector.txt) and the
pybind calls release the GIL. self._lock guards what both threads touch: the session's
registrations and lists (_setup, _recover), the pulls, the notifications in flight, the
load errors and the counters. The lock is never held across a read_blocks or notify call,
so get_finished never waits for a read to start or a notification to be delivered."""

import dataclasses
import logging
import queue
import threading
import time

import ferry

from . import metadata as md
from . import tp_mapping
from .compat import geometry

log = logging.getLogger("ferry.vllm")

# How long a call waits for the node's agent to answer (also for a restarted one to be
# back), and how long the worker leaves an agent that did not answer alone: a step of the
# forward loop never waits on a dead agent for longer, and not on every step.
AGENT_WAIT_S = 0.5
AGENT_RETRY_S = 1.0
AGENT_CONNECT_S = 10.0

_clients = {}


def client(socket=None):
    """This process's ferry.Client of the agent at `socket` (default: ferry.default_socket()),
    the one FerryConnector's workers use: allocate KV caches in agent memory with it."""
    socket = socket or ferry.default_socket()
    if socket not in _clients:
        # The client's timeout is also how long a call waits for a restarted agent: short.
        # A busy agent at start-up gets a few tries (it is there; nothing runs yet).
        end = time.monotonic() + AGENT_CONNECT_S
        while True:
            try:
                _clients[socket] = ferry.Client(socket, timeout=AGENT_WAIT_S)
                break
            except ferry.Unavailable:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)
    return _clients[socket]


def _dense_flat(t):
    """A 1-D uint8 view of all of `t`'s memory: the registration covers the tensor whatever
    its stride order (vLLM hands out HND caches as permuted views of a dense tensor)."""
    torch = ferry._torch()
    if not t.is_contiguous():
        order = sorted(range(t.dim()), key=lambda i: t.stride(i))
        expect = 1
        for i in order:
            if t.stride(i) != expect:
                raise ValueError(f"KV cache of shape {tuple(t.shape)} and strides "
                                 f"{t.stride()} is not dense: ferry registers whole tensors")
            expect *= t.shape[i]
        t = torch.as_strided(t, (t.numel(),), (1,))
    return t.view(-1).view(torch.uint8)


@dataclasses.dataclass
class _Pull:
    local_block_ids: list
    parts: list = dataclasses.field(default_factory=list)   # (Handle, local block per pair)
    failed: set = dataclasses.field(default_factory=set)
    started: bool = False   # the start thread tried every read: only then can it finish


@dataclasses.dataclass
class _Lease:
    deadline: float
    expected: int = 0
    got: set = dataclasses.field(default_factory=set)
    known: bool = False   # vLLM finished the request and handed us its blocks


class WorkerSide:
    def __init__(self, vllm_config, engine_id, extra, tp_rank, tp_size):
        self.geometry = geometry(vllm_config)
        self.mla = self.geometry["mla"]
        self.engine_id = engine_id
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.socket = extra.get("ferry_socket") or ferry.default_socket()
        self.pull_timeout = float(extra.get("pull_timeout_s", 30.0))
        self.lease_s = float(extra.get("lease_s", 120.0))
        self.most = int(extra.get("max_tp_ratio", 8))
        self.base = f"vllm.{engine_id}.r{tp_rank}"
        self.prefix = f"{md.NOTIFY_ROOT}/{engine_id}/p{tp_rank}/"
        self.client = None
        self._exported = False      # the layers and lists are there on the client's session
        self._down_until = 0.0      # the agent did not answer: no call to it before then
        self._layers = []           # (layer name, flat uint8 view)
        self._regs = []
        self._lists = {}            # k -> BlockList cut in k (x1 and the exported cuts)
        self._splits = []
        self.planes = self.num_blocks = self.plane_bytes = 0
        self._pulls = {}            # request id -> _Pull
        self._load_errors = set()
        self._leases = {}           # prefill: request id -> _Lease
        self._vllm_finished = set()
        self.stats = dict(pulls=0, pairs=0, notify_only=0, heartbeats=0, renewed=0,
                          freed_by_notify=0, freed_by_lease=0, duplicates=0, unknown=0,
                          restarts=0, failed_blocks=0)
        # The start thread (module docstring). _gen counts the times the moves in flight
        # were dropped: a read that returns after a drop belongs to the session that went.
        self._lock = threading.RLock()
        self._tasks = queue.Queue()
        self._thread = None
        self._queued = 0            # tasks put and not done yet (idle() waits for them)
        self._stopping = False
        self._gen = 0

    # --- registration -------------------------------------------------------------------

    def register_kv_caches(self, kv_caches):
        layers = []
        for name, t in kv_caches.items():
            if t.dim() == 5 and t.shape[0] == 2 and not self.mla:
                planes, blocks = 2, t.shape[1]
            elif t.dim() == 3 and self.mla:
                planes, blocks = 1, t.shape[0]
            else:
                raise ValueError(f"{name}: KV cache of shape {tuple(t.shape)}: ferry.vllm "
                                 "handles (2, blocks, ...) caches and MLA's (blocks, tokens, "
                                 "dim)")
            layers.append((name, _dense_flat(t), planes, blocks))
        if not layers:
            raise ValueError("register_kv_caches: no layers")
        self.planes, self.num_blocks = layers[0][2], layers[0][3]
        nbytes = layers[0][1].numel()
        if any(p != self.planes or b != self.num_blocks or f.numel() != nbytes
               for _, f, p, b in layers):
            raise ValueError("register_kv_caches: layers differ in shape; ferry.vllm needs "
                             "uniform layers")
        self.plane_bytes = nbytes // (self.planes * self.num_blocks)
        g = self.geometry
        if not self.mla:
            heads = g["kv_heads"] // self.tp_size
            elt = self.plane_bytes // (heads * g["block_size"] * g["head_size"])
            if elt * heads * g["block_size"] * g["head_size"] != self.plane_bytes:
                raise ValueError(f"a block of {self.plane_bytes} bytes is not {heads} heads x "
                                 f"{g['block_size']} tokens x {g['head_size']}")
            self._splits = tp_mapping.remote_splits(heads, self.most)
        self._layers = [(n, f) for n, f, _, _ in layers]
        self.client = client(self.socket)
        self._setup()

    def _setup(self):
        """Registers the layers and exports the lists on the client's session (again after
        the agent restarted: the new run has none of them)."""
        # What a set-up before this one left (a call that raced a recovery on the other
        # thread can report the agent gone after it was set up again): its names are taken.
        # A restart this finds is the caller's to handle (_recover counts it).
        self._release(restarts=True)
        c = self.client
        try:
            for i, (_, f) in enumerate(self._layers):
                self._regs.append(c.register(f, name=f"{self.base}.L{i}"))
            self._lists[1] = c.prepare_blocks(self._regs, self.plane_bytes,
                                              name=f"{self.base}.x1")
            for k in self._splits:
                self._lists[k] = c.prepare_blocks(self._regs, self.plane_bytes // k,
                                                  name=f"{self.base}.x{k}")
        except ferry.Error:
            self._release()  # a later try starts from nothing (the names are free again)
            raise
        self._exported = True

    def _release(self, restarts=False):
        """Ends the lists and registrations _setup made, as far as the agent still has them
        (ferry.AgentRestarted, raised once by whichever call finds the restart, passes
        through with `restarts`)."""
        for bl in list(self._lists.values()):
            try:
                bl.release()
            except ferry.AgentRestarted:
                if restarts:
                    raise
            except ferry.Error:
                pass  # gone with the agent's run
        for r in self._regs:
            try:
                self.client.deregister(r)
            except ferry.AgentRestarted:
                if restarts:
                    raise
            except ferry.Error:
                pass
        self._regs, self._lists = [], {}
        self._exported = False

    def _local_list(self, k):
        """This rank's blocks cut in k (made once, not exported unless it already was)."""
        if k not in self._lists:
            self._lists[k] = self.client.prepare_blocks(self._regs, self.plane_bytes // k)
        return self._lists[k]

    def get_handshake_metadata(self):
        return md.FerryHandshake(node=self.client.node, list_base=self.base,
                                 tp_rank=self.tp_rank, tp_size=self.tp_size,
                                 num_blocks=self.num_blocks, splits=[1] + self._splits)

    # --- the agent: restarts and absences -----------------------------------------------

    def _drop_in_flight(self):
        """The moves in flight are gone with the session that started them: their pulls
        fail (their blocks are reported), their notifications are not sent. A pull whose
        reads the start thread has not begun stays: they start on the session to come."""
        self._gen += 1
        for pull in self._pulls.values():
            if pull.started or pull.parts:
                pull.failed.update(pull.local_block_ids)
                pull.parts = []

    def _recover(self, error):
        """ferry.AgentRestarted: the client is on a new session and the old run's
        registrations and lists are gone; registers and exports them again (leases stay:
        vLLM still holds their blocks, exported anew under the same names)."""
        log.warning("ferry.vllm %s: the agent restarted (%s); registering again", self.base,
                    error)
        self.stats["restarts"] += 1
        self._drop_in_flight()
        self._setup()

    def _went_away(self, error):
        log.warning("ferry.vllm %s: the agent does not answer (%s); leases still run out, "
                    "pulls fail, next try in %g s", self.base, error, AGENT_RETRY_S)
        self._drop_in_flight()
        self._exported = False  # whatever comes back has to be told again
        self._down_until = time.monotonic() + AGENT_RETRY_S

    def _lost(self, error):
        """The agent restarted (ferry.AgentRestarted: set up again) or went away."""
        if isinstance(error, ferry.AgentRestarted):
            try:
                return self._recover(error)
            except ferry.Error as again:
                error = again
        self._went_away(error)

    def _reachable(self):
        """Whether to call the agent now: not while it was away a moment ago; once it is
        back, the layers and lists are there again (False if that failed)."""
        if self.client is None or time.monotonic() < self._down_until:
            return False
        if self._exported:
            return True
        try:
            try:
                self._setup()
            except ferry.AgentRestarted as e:
                self._recover(e)  # sets up on the client's new session
            return True
        except ferry.Error as e:
            self._lost(e)
            return self._exported

    def _call(self, fn):
        """fn() on the agent; when it raises ferry.AgentRestarted (once, from whichever call
        comes first after the restart) the worker sets up again and fn runs once more.
        Either thread may call it; the recovery runs under the lock."""
        try:
            return fn()
        except ferry.AgentRestarted as e:
            with self._lock:
                self._recover(e)
            return fn()

    def _current(self, k):
        """(generation, this rank's list cut in k) as the session has them now, for a read
        the start thread makes outside the lock."""
        with self._lock:
            if not self._exported:
                raise ferry.Unavailable(f"ferry.vllm {self.base}: not set up on the agent at "
                                        f"{self.socket} (it went away)")
            return self._gen, self._local_list(k)

    # --- the start thread ---------------------------------------------------------------

    def _enqueue(self, task):
        with self._lock:
            if self._stopping:
                return
            self._queued += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"ferry-vllm-start {self.base}")
                self._thread.start()
        self._tasks.put(task)

    def _run(self):
        while True:
            task = self._tasks.get()
            if task is None or self._stopping:
                return
            try:
                pulls, renew = task
                with self._lock:
                    up = self._reachable()
                for rid, rr in pulls:
                    self._start_pull(rid, rr, up)
                if up and renew:
                    self._heartbeats(renew)
            except Exception:  # noqa: BLE001: the thread must outlive one bad task
                log.exception("ferry.vllm %s: starting a step's moves failed", self.base)
                with self._lock:
                    for rid, _ in task[0]:
                        pull = self._pulls.get(rid)
                        if pull is not None and not pull.started:
                            pull.failed.update(pull.local_block_ids)
                            pull.started = True
            finally:
                with self._lock:
                    self._queued -= 1

    # --- decode: pulls ------------------------------------------------------------------

    def start_load_kv(self, meta):
        now = time.monotonic()
        for rid, lease_s in meta.reqs_to_send.items():
            lease = self._leases.setdefault(rid, _Lease(now + lease_s))
            lease.known = True
            lease.deadline = max(lease.deadline, now + lease_s)
        if not meta.reqs_to_recv and not meta.reqs_to_renew:
            return
        pulls = list(meta.reqs_to_recv.items())
        with self._lock:  # not finished before the start thread tried their reads
            for rid, rr in pulls:
                if rr.local_block_ids:
                    self._pulls[rid] = _Pull(list(rr.local_block_ids))
        self._enqueue((pulls, list(meta.reqs_to_renew.values())))

    def _start_pull(self, rid, rr, up):
        p, local = rr.params, list(rr.local_block_ids)
        P, D = int(p["remote_tp_size"]), self.tp_size
        why = tp_mapping.check_sizes(P, D, self.geometry["kv_heads"], self.mla)
        remote = list(p["remote_block_ids"])
        if not why and len(local) > len(remote):
            why = f"{len(local)} local blocks but the prefill request has {len(remote)}"
        if not why and not up:
            why = f"the agent at {self.socket} does not answer"
        if not local:  # nothing to pull: prefill frees its blocks on our word
            with self._lock:
                self.stats["notify_only"] += 1
            if up:
                self._notify_done(p)
            return
        with self._lock:
            pull = self._pulls.get(rid)
        if pull is None:  # shut down meanwhile
            return
        try:
            self._start_reads(rid, p, pull, local, remote, why, up)
        except Exception:  # noqa: BLE001: a bug here fails the pull, never hangs it
            log.exception("ferry.vllm: the pull of request %s failed to start", rid)
            with self._lock:
                pull.failed.update(local)
        finally:
            # Finished once its reads started: a restart noticed by one of them (the client
            # raises AgentRestarted once, then the read is made again) fails only what
            # the old session had started.
            with self._lock:
                pull.started = True

    def _start_reads(self, rid, p, pull, local, remote, why, up):
        P, D = int(p["remote_tp_size"]), self.tp_size
        if why:
            log.error("ferry.vllm: request %s cannot be pulled: %s", rid, why)
            with self._lock:
                pull.failed.update(local)
            if up:
                self._notify_done(p)
            return
        remote = remote[len(remote) - len(local):]
        expected = tp_mapping.expected_notifications(D, P)
        read_ranks = set()
        for read in tp_mapping.reads(self.tp_rank, D, P, self.mla):
            node, rbase, rblocks, rsplits = p["remote_ranks"][read.prefill_rank]
            name, payload = md.done(md.notify_prefix(p["remote_ranks"][0][1],
                                                     read.prefill_rank),
                                    p["remote_request_id"], self.tp_rank, expected)
            if read.remote_split not in rsplits:
                log.error("ferry.vllm: %s exports no list cut in %d (it has %s)", rbase,
                          read.remote_split, rsplits)
                with self._lock:
                    pull.failed.update(local)
                continue  # the rank hears from _notify_done below
            lids, rids = tp_mapping.pair_ids(self.planes * len(self._layers), self.num_blocks,
                                             rblocks, local, remote, read)
            def start(read=read, lids=lids, rids=rids, node=node, rbase=rbase, name=name,
                      payload=payload):
                gen, bl = self._current(read.local_split)
                return gen, self.client.read_blocks(
                    node, f"{rbase}.x{read.remote_split}", rids, bl, lids, notify=name,
                    notify_payload=payload, timeout=self.pull_timeout)
            try:
                gen, h = self._call(start)
            except ferry.Error as e:
                log.error("ferry.vllm: pull of request %s from %s failed to start: %s", rid,
                          node, e)
                with self._lock:
                    pull.failed.update(local)
                continue
            read_ranks.add(read.prefill_rank)
            with self._lock:
                self.stats["pulls"] += 1
                self.stats["pairs"] += len(lids)
                if gen == self._gen:
                    pull.parts.append((h, local))
                else:  # started on the session that went while it was being made
                    pull.failed.update(local)
        self._notify_done(p, skip=read_ranks)

    def _answered_ranks(self, p):
        """(prefill rank, its node, its list base, its notification prefix) of each prefill
        rank this rank answers for."""
        P = int(p["remote_tp_size"])
        for r in tp_mapping.notified(self.tp_rank, self.tp_size, P):
            if r < P:
                node, rbase = p["remote_ranks"][r][0], p["remote_ranks"][r][1]
                yield r, node, rbase, md.notify_prefix(p["remote_ranks"][0][1], r)

    def _notify_done(self, p, skip=()):
        """Tells each prefill rank this rank answers for (but those a pull's own
        notification tells) that it is done with the request."""
        expected = tp_mapping.expected_notifications(self.tp_size, int(p["remote_tp_size"]))
        for r, node, rbase, prefix in self._answered_ranks(p):
            if r not in skip:
                self._notify_to(node, rbase,
                              *md.done(prefix, p["remote_request_id"], self.tp_rank, expected))

    def _heartbeats(self, params):
        """One notification per prefill rank renews the leases of every request this rank
        still wants from it (its payload names them)."""
        wanted = {}
        for p in params:
            for _, node, rbase, prefix in self._answered_ranks(p):
                wanted.setdefault((node, rbase, prefix), []).append(p["remote_request_id"])
        for (node, rbase, prefix), rids in wanted.items():
            with self._lock:
                self.stats["renewed"] += len(rids)
            for name, payload in md.heartbeats(prefix, rids):
                with self._lock:
                    self.stats["heartbeats"] += 1
                self._notify_to(node, rbase, name, payload)

    def _notify_to(self, node, rbase, name, payload):
        """A notification alone to the prefill rank that exported "<rbase>.x1" (its owner
        takes it); returns once node's agent has it (on the start thread, outside the
        lock)."""
        try:
            self._call(lambda: self.client.notify(node, f"{rbase}.x1", name, payload,
                                                  timeout=self.pull_timeout))
        except ferry.Error as e:  # the lease on the other side frees the blocks
            log.warning("ferry.vllm: notification %s to %s not sent: %s", name, node, e)

    def _finished_pulls(self):
        done = set()
        for rid, pull in list(self._pulls.items()):
            if not pull.started:
                continue
            try:
                if not all(h.done() for h, _ in pull.parts):
                    continue
                for h, local in pull.parts:
                    if h.status() != "succeeded":
                        r, failed = h.result(), h.failed()
                        log.error("ferry.vllm: pull of request %s: %d of its blocks failed: "
                                  "%s", rid, len(failed), r.get("message") or failed[:1])
                        n = len(local)
                        pull.failed.update(local[i % n] for i, _, _ in failed)
            except (ferry.AgentRestarted, ferry.Unavailable):
                raise  # the agent: get_finished
            except ferry.Error as e:
                log.error("ferry.vllm: pull of request %s: %s", rid, e)
                pull.failed.update(pull.local_block_ids)
            self.stats["failed_blocks"] += len(pull.failed)
            self._load_errors |= pull.failed
            done.add(rid)
            del self._pulls[rid]
        return done

    # --- prefill: notifications and leases ----------------------------------------------

    def _finished_sending(self):
        now = time.monotonic()
        for n in self.client.poll_notifications(self.prefix):
            said = md.parse(self.prefix, n.name, n.payload)
            if said is None:
                self.stats["unknown"] += 1
                continue
            for rid, rank, expected in said:
                lease = self._leases.setdefault(rid, _Lease(now + self.lease_s))
                if rank is None:
                    lease.deadline = max(lease.deadline, now + self.lease_s)
                    continue
                if rank in lease.got:
                    self.stats["duplicates"] += 1
                lease.got.add(rank)
                lease.expected = expected
        return self._expire_leases()

    def _expire_leases(self):
        """The requests whose blocks are free to go: every decode rank said so, or the
        lease ran out; drops notifications about no request of ours once theirs did."""
        now = time.monotonic()
        done = set()
        for rid, lease in list(self._leases.items()):
            complete = lease.expected and len(lease.got) >= lease.expected
            if lease.known and rid in self._vllm_finished and (complete or
                                                               now > lease.deadline):
                self.stats["freed_by_notify" if complete else "freed_by_lease"] += 1
                if not complete:
                    log.warning("ferry.vllm: lease of request %s ran out after %s of %s "
                                "decode ranks; its blocks are freed", rid, len(lease.got),
                                lease.expected or "?")
                done.add(rid)
                del self._leases[rid]
            elif not lease.known and now > lease.deadline:  # about no request of ours
                self.stats["unknown"] += 1
                del self._leases[rid]
        return done

    # --- every step ---------------------------------------------------------------------

    def get_finished(self, finished_req_ids):
        with self._lock:  # the start thread holds it only between its agent calls
            return self._get_finished(finished_req_ids)

    def _get_finished(self, finished_req_ids):
        self._vllm_finished |= set(finished_req_ids)
        sending = None
        if self._reachable():
            try:
                sending = self._call(self._finished_sending)
            except ferry.Error as e:  # gone, or back but setting up again failed
                self._lost(e)
        if sending is None:  # leases still run out while the agent is away
            sending = self._expire_leases()
        try:
            recving = self._finished_pulls()
        except ferry.Unavailable as e:  # AgentRestarted too: a handle's check noticed
            self._lost(e)
            recving = self._finished_pulls()  # the pulls in flight failed: no call
        self._vllm_finished -= sending
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self):
        with self._lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def idle(self):
        """True when nothing is queued, in flight or leased (the harness checks it at the
        end)."""
        with self._lock:
            return not self._queued and not self._pulls and not self._leases

    def shutdown(self):
        """Stops the start thread (after the task it is on: a read returns once the agent
        planned it, within pull_timeout) and ends what this rank holds on the agent."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        if thread is not None:
            self._tasks.put(None)
            thread.join(self.pull_timeout + 5)
            if thread.is_alive():
                log.error("ferry.vllm %s: the start thread did not stop within %g s",
                          self.base, self.pull_timeout + 5)
        with self._lock:
            self._shutdown()

    def _shutdown(self):
        for h, _ in [part for pull in self._pulls.values() for part in pull.parts]:
            try:
                h.cancel()
            except ferry.Error:
                pass
        self._pulls = {}
        if self.client is None:
            return
        self._release()
        self.client = None  # the process's client (client()) stays for its other users
