"""The scheduler side of FerryConnector: bookkeeping only, it moves no byte and holds no
ferry client. Prefill: request_finished keeps a finished request's blocks (delay-free) and
hands out where they are (kv_transfer_params). Decode: get_num_new_matched_tokens says the
prompt's KV will arrive asynchronously, update_state_after_alloc says into which blocks,
build_connector_meta passes both to the workers once."""

import logging
import time

from . import metadata as md
from . import tp_mapping
from .compat import compat_hash, differences, geometry

log = logging.getLogger("ferry.vllm")


def _status_name(request):
    s = getattr(request, "status", None)
    return getattr(s, "name", str(s))


class SchedulerSide:
    def __init__(self, vllm_config, engine_id, extra):
        self.geometry = geometry(vllm_config)
        self.compat = compat_hash(self.geometry)
        self.engine_id = engine_id
        self.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self.lease_s = float(extra.get("lease_s", 120.0))
        self.heartbeat_s = float(extra.get("heartbeat_s", self.lease_s / 4))
        self.handshakes = {}
        self._recv = {}        # this step's pulls (and notification-only releases)
        self._send = {}        # this step's delay-freed prefill requests
        self._leased = {}      # decode: request id -> params while prefill holds blocks
        self._last_renew = time.monotonic()
        self._refused = set()  # requests whose params this side cannot use (logged once)

    def set_xfer_handshake_metadata(self, metadata):
        """{tp rank: FerryHandshake} of this engine's workers (vLLM gathers them once)."""
        self.handshakes = dict(metadata)

    def _usable(self, request, p):
        """None when this decode engine can pull what `p` describes; else why not."""
        if p.get("compat_hash") != self.compat:
            return ("compatibility hash differs: " +
                    "; ".join(differences(self.geometry, p.get("geometry"))))
        if not p.get("remote_ranks"):
            return "kv_transfer_params name no prefill ranks"
        return tp_mapping.check_sizes(int(p["remote_tp_size"]), self.tp_size,
                                      self.geometry["kv_heads"], self.geometry["mla"])

    def on_new_request(self, request):
        p = request.kv_transfer_params
        if p and p.get("do_remote_prefill"):
            self._leased[request.request_id] = dict(p)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """The prompt tokens past the local prefix hit, loaded asynchronously; (0, False)
        when there is nothing to pull or this side cannot use what prefill offers. No side
        effects: vLLM may ask more than once."""
        p = request.kv_transfer_params
        if not p or not p.get("do_remote_prefill") or self._usable(request, p):
            return 0, False
        count = len(request.prompt_token_ids) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """First call for a remote-prefill request: pull into the blocks just allocated (or,
        with nothing to pull, only release prefill's). The second call (after the load) and
        calls for other requests do nothing: do_remote_prefill is off by then."""
        p = request.kv_transfer_params
        if not p or not p.get("do_remote_prefill"):
            return
        rid = request.request_id
        why = self._usable(request, p)
        if why and rid not in self._refused:
            self._refused.add(rid)
            log.error("ferry.vllm: request %s recomputes its prompt: %s", rid, why)
        local = []
        if num_external_tokens > 0 and not why:
            unhashed = getattr(blocks, "get_unhashed_block_ids", None)
            local = list(unhashed()) if unhashed else list(blocks.get_block_ids()[0])
        self._recv[rid] = md.RecvRequest(dict(p), local)
        self._leased[rid] = dict(p)
        p["do_remote_prefill"] = False

    def build_connector_meta(self, scheduler_output):
        meta = md.FerryConnectorMetadata(reqs_to_recv=self._recv, reqs_to_send=self._send)
        now = time.monotonic()
        if self._leased and now - self._last_renew >= self.heartbeat_s:
            meta.reqs_to_renew = {r: p for r, p in self._leased.items() if r not in self._recv}
            self._last_renew = now
        self._recv, self._send = {}, {}
        return meta

    def update_connector_output(self, connector_output):
        for rid in getattr(connector_output, "finished_recving", None) or ():
            self._leased.pop(rid, None)
            self._refused.discard(rid)

    def request_finished(self, request, block_ids):
        rid = request.request_id
        p = request.kv_transfer_params
        self._leased.pop(rid, None)
        self._refused.discard(rid)
        if not p:
            return False, None
        if p.get("do_remote_prefill"):
            # Aborted before it was scheduled: no pull, but prefill must still hear that we
            # are done, or it holds the blocks until the lease runs out.
            self._recv[rid] = md.RecvRequest(dict(p), [])
            p["do_remote_prefill"] = False
            return False, None
        if not p.get("do_remote_decode") or _status_name(request) != "FINISHED_LENGTH_CAPPED":
            return False, None
        if block_ids and isinstance(block_ids[0], (list, tuple)):  # one list per KV group
            block_ids = block_ids[0]
        if not block_ids:
            return False, None
        if not self.handshakes:
            log.error("ferry.vllm: no worker handshake; request %s is not offered to decode",
                      rid)
            return False, None
        self._send[rid] = self.lease_s
        return True, md.transfer_params(self.handshakes, rid, block_ids, self.compat,
                                        self.geometry, self.lease_s)
