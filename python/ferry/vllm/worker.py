"""The worker side of FerryConnector: one per TP rank, in the model runner's process.

Every rank registers its layer tensors with its node's agent (one registration each) and
exports one block list over them, "<base>.x1" (plane t = layer * planes + K/V, block b is
index t * num_blocks + b), the same list cut in k for the decode ranks of a larger TP
("<base>.x<k>", ferry/vllm/tp_mapping.py) and a one-block "<base>.bell" that carries
notifications on their own. Decode ranks pull (read_blocks, one call per prefill rank they
read, with a notification); prefill ranks free a request's blocks once every decode rank
that reads them said so, or when its lease (renewed by decode's heartbeats) runs out."""

import dataclasses
import logging
import time

import ferry

from . import metadata as md
from . import tp_mapping
from .compat import geometry

log = logging.getLogger("ferry.vllm")

BELL_BYTES = 64


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
        self._retry_at = 0.0
        self._layers = []           # (layer name, flat uint8 view)
        self._regs = []
        self._lists = {}            # k -> BlockList cut in k (x1 and the exported cuts)
        self._splits = []
        self._bell = None           # (tensor, BlockList)
        self.planes = self.num_blocks = self.plane_bytes = 0
        self._pulls = {}            # request id -> _Pull
        self._bells = []            # notification-only moves still running
        self._load_errors = set()
        self._leases = {}           # prefill: request id -> _Lease
        self._vllm_finished = set()
        self.stats = dict(pulls=0, pairs=0, notify_only=0, heartbeats=0, freed_by_notify=0,
                          freed_by_lease=0, duplicates=0, unknown=0, restarts=0,
                          failed_blocks=0)

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
        self._setup()

    def _setup(self):
        """Registers the layers and exports the lists on a new client (also after the
        agent restarted: it lost them)."""
        torch = ferry._torch()
        now = time.monotonic()
        if now < self._retry_at:  # the agent was not there a moment ago: do not wait again
            raise ferry.Unavailable(f"{self.socket}: the agent did not answer; retry later")
        self._retry_at = now + 1.0
        self.client = ferry.Client(self.socket, timeout=1.0)
        self._regs = [self.client.register(f, name=f"{self.base}.L{i}")
                      for i, (_, f) in enumerate(self._layers)]
        self._lists = {1: self.client.prepare_blocks(self._regs, self.plane_bytes,
                                                     name=f"{self.base}.x1")}
        for k in self._splits:
            self._lists[k] = self.client.prepare_blocks(self._regs, self.plane_bytes // k,
                                                        name=f"{self.base}.x{k}")
        bell = torch.zeros(BELL_BYTES, dtype=torch.uint8).share_memory_()
        self._bell = (bell, self.client.prepare_blocks([bell], BELL_BYTES,
                                                       name=f"{self.base}.bell"))

    def _local_list(self, k):
        """This rank's blocks cut in k (made once, not exported unless it already was)."""
        if k not in self._lists:
            self._lists[k] = self.client.prepare_blocks(self._regs, self.plane_bytes // k)
        return self._lists[k]

    def get_handshake_metadata(self):
        return md.FerryHandshake(node=self.client.node, list_base=self.base,
                                 tp_rank=self.tp_rank, tp_size=self.tp_size,
                                 num_blocks=self.num_blocks, splits=[1] + self._splits)

    def _recover(self, error):
        """The agent restarted (ferry.AgentRestarted) or its session is gone: everything it
        held for us is lost. Pulls in flight fail (their blocks are reported), the rest is
        registered and exported again; leases stay, the blocks they hold are exported anew."""
        log.warning("ferry.vllm %s: agent lost our session (%s); registering again",
                    self.base, error)
        self.stats["restarts"] += 1
        for pull in self._pulls.values():
            pull.failed.update(pull.local_block_ids)
            pull.parts = []
        self._bells = []
        self._setup()

    @staticmethod
    def _lost_session(e):
        restarted = getattr(ferry, "AgentRestarted", None)
        if restarted is not None and isinstance(e, restarted):
            return True
        text = str(e)
        return isinstance(e, ferry.Error) and ("is not open" in text or "Broken pipe" in text
                                               or e.code == 14)

    # --- decode: pulls ------------------------------------------------------------------

    def start_load_kv(self, meta):
        now = time.monotonic()
        if self.client is None:
            try:
                self._setup()
            except ferry.Error as e:  # pulls fail below, and are reported
                log.warning("ferry.vllm %s: agent not back yet: %s", self.base, e)
        for rid, lease_s in meta.reqs_to_send.items():
            lease = self._leases.setdefault(rid, _Lease(now + lease_s))
            lease.known = True
            lease.deadline = max(lease.deadline, now + lease_s)
        for rid, rr in meta.reqs_to_recv.items():
            self._start_pull(rid, rr)
        for rid, params in meta.reqs_to_renew.items():
            self._notify(params, None, heartbeat=True)

    def _start_pull(self, rid, rr):
        p, local = rr.params, list(rr.local_block_ids)
        P, D = int(p["remote_tp_size"]), self.tp_size
        why = tp_mapping.check_sizes(P, D, self.geometry["kv_heads"], self.mla)
        remote = list(p["remote_block_ids"])
        if not why and len(local) > len(remote):
            why = f"{len(local)} local blocks but the prefill request has {len(remote)}"
        if not local:  # nothing to pull: prefill frees its blocks on our word
            self.stats["notify_only"] += 1
            self._notify(p, None)
            return
        pull = _Pull(local)
        self._pulls[rid] = pull
        if why:
            log.error("ferry.vllm: request %s cannot be pulled: %s", rid, why)
            pull.failed.update(local)
            self._notify(p, None)
            return
        remote = remote[len(remote) - len(local):]
        expected = tp_mapping.expected_notifications(D, P)
        read_ranks = set()
        for read in tp_mapping.reads(self.tp_rank, D, P, self.mla):
            node, rbase, rblocks, rsplits = p["remote_ranks"][read.prefill_rank]
            name = md.done_name(md.notify_prefix(p["remote_ranks"][0][1], read.prefill_rank),
                                p["remote_request_id"], self.tp_rank, expected)
            if read.remote_split not in rsplits:
                log.error("ferry.vllm: %s exports no list cut in %d (it has %s)", rbase,
                          read.remote_split, rsplits)
                pull.failed.update(local)
                continue  # the rank hears from _notify below
            lids, rids = tp_mapping.pair_ids(self.planes * len(self._layers), self.num_blocks,
                                             rblocks, local,
                                             remote, read)
            try:
                if self.client is None:
                    raise ferry.Unavailable(f"no session with this node's agent ({self.socket})")
                h = self.client.read_blocks(node, f"{rbase}.x{read.remote_split}", rids,
                                            self._local_list(read.local_split), lids,
                                            notify=name, timeout=self.pull_timeout)
            except ferry.Error as e:
                log.error("ferry.vllm: pull of request %s from %s failed to start: %s", rid,
                          node, e)
                pull.failed.update(local)
                continue
            read_ranks.add(read.prefill_rank)
            self.stats["pulls"] += 1
            self.stats["pairs"] += len(lids)
            pull.parts.append((h, local))
        self._notify(p, None, skip=read_ranks)

    def _notify(self, p, _unused, heartbeat=False, skip=()):
        """Tells each prefill rank this rank answers for that it is done with the request
        (or, with `heartbeat`, that it still wants the blocks), through the rank's bell."""
        P = int(p["remote_tp_size"])
        expected = tp_mapping.expected_notifications(self.tp_size, P)
        for r in tp_mapping.notified(self.tp_rank, self.tp_size, P):
            if r in skip or r >= P:
                continue
            node, rbase = p["remote_ranks"][r][0], p["remote_ranks"][r][1]
            prefix = md.notify_prefix(p["remote_ranks"][0][1], r)
            rid = p["remote_request_id"]
            name = (md.heartbeat_name(prefix, rid) if heartbeat
                    else md.done_name(prefix, rid, self.tp_rank, expected))
            if heartbeat:
                self.stats["heartbeats"] += 1
            self._bell_to(node, rbase, name)

    def _bell_to(self, node, rbase, name):
        if self.client is None:
            return
        try:
            self._bells.append(self.client.read_blocks(node, f"{rbase}.bell", [0],
                                                       self._bell[1], [0], notify=name,
                                                       timeout=self.pull_timeout))
        except ferry.Error as e:  # the lease on the other side frees the blocks
            log.warning("ferry.vllm: notification %s to %s not sent: %s", name, node, e)

    def _finished_pulls(self):
        done = set()
        for rid, pull in list(self._pulls.items()):
            try:
                if not all(h.done() for h, _ in pull.parts):
                    continue
                for h, local in pull.parts:
                    if h.status() != "succeeded":
                        n = len(local)
                        pull.failed.update(local[i % n] for i, _, _ in h.failed())
            except ferry.Error as e:
                if self._lost_session(e):
                    raise
                log.error("ferry.vllm: pull of request %s: %s", rid, e)
                pull.failed.update(pull.local_block_ids)
            self.stats["failed_blocks"] += len(pull.failed)
            self._load_errors |= pull.failed
            done.add(rid)
            del self._pulls[rid]
        return done

    # --- prefill: notifications and leases ----------------------------------------------

    def _poll(self):
        c = self.client
        if hasattr(c, "poll_notifications"):
            return c.poll_notifications(self.prefix)
        return list(c.notifications(self.prefix, timeout=0.001))  # before poll_notifications

    def _finished_sending(self):
        now = time.monotonic()
        for n in self._poll():
            parsed = md.parse(self.prefix, n.name)
            if parsed is None:
                self.stats["unknown"] += 1
                continue
            rid, rank, expected = parsed
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
        self._vllm_finished |= set(finished_req_ids)
        try:
            if self.client is None:  # the agent was gone at the last try
                self._setup()
            sending = self._finished_sending()
            recving = self._finished_pulls()
        except ferry.Error as e:
            if not self._lost_session(e):
                raise
            try:
                self._recover(e)
            except ferry.Error as again:  # not back yet: leases still run out, pulls fail
                log.warning("ferry.vllm %s: agent not back yet: %s", self.base, again)
                self.client = None
            sending, recving = self._expire_leases(), self._finished_pulls()
        self._bells = [h for h in self._bells if not self._settled(h)]
        self._vllm_finished -= sending
        return sending or None, recving or None

    def _settled(self, h):
        try:
            return h.done()
        except ferry.Error:
            return True

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def idle(self):
        """True when nothing is in flight or leased (the harness checks it at the end)."""
        return not self._pulls and not self._leases and not self._bells

    def shutdown(self):
        for h, _ in [part for pull in self._pulls.values() for part in pull.parts]:
            try:
                h.cancel()
            except ferry.Error:
                pass
        self._pulls = {}
        if self.client is None:
            return
        try:
            for bl in self._lists.values():
                bl.release()
            if self._bell:
                self._bell[1].release()
            for r in self._regs:
                self.client.deregister(r)
        except ferry.Error as e:
            log.warning("ferry.vllm %s: shutdown: %s", self.base, e)
        self._lists, self._regs, self._bell = {}, [], None
        self.client.close()
        self.client = None
