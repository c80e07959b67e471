"""ferry.vllm.FerryConnector: vLLM's v1 KV connector over ferry (disaggregated prefill).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "FerryConnector",
        "kv_connector_module_path": "ferry.vllm", "kv_role": "kv_both"}'

The pull design of vLLM's NixlConnector: prefill keeps a finished request's blocks and
returns where they are in kv_transfer_params (the proxy hands them to decode); each decode
rank pulls them with one read_blocks per prefill rank it reads (heterogeneous TP both ways,
ferry/vllm/tp_mapping.py) and notifies; prefill frees the blocks on the last expected
notification, or when their lease (renewed by decode's heartbeats) runs out.

Written from vLLM's source at commit 003df2961dd8830c317a61f9745ccd557da9fa06 (main, read
2026-12-07), these files:
  vllm/distributed/kv_transfer/kv_connector/v1/base.py   the API: every method here and
      its contract (get_num_new_matched_tokens side-effect free; update_state_after_alloc
      called twice for async loads; request_finished once, before the blocks are freed;
      get_finished's sending ids only from finished_req_ids; load errors by the pass that
      reports the request)
  vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py   the reference pull
      design: request_finished's delay-free for FINISHED_LENGTH_CAPPED, do_remote_prefill
      still set at request_finished = aborted before scheduling (notify prefill with no
      blocks), remote_block_ids trimmed to the local unhashed blocks, HND for heterogeneous
      TP, notifications counted per prefill rank, an abort timeout on prefill
  vllm/v1/core/sched/scheduler.py   Scheduler.schedule (get_num_new_matched_tokens, then
      allocate_slots, then update_state_after_alloc; WAITING_FOR_REMOTE_KVS; at the end
      build_connector_meta), update_from_output (update_connector_output, finished_sending
      frees blocks, invalid_block_ids), _update_waiting_for_remote_kv, finish_requests ->
      request_finished
  vllm/v1/worker/kv_connector_model_runner_mixin.py   per step: bind_connector_metadata,
      start_load_kv, (forward: wait_for_layer_load / save_kv_layer per layer),
      wait_for_save, get_finished(finished_req_ids), get_block_ids_with_load_errors,
      clear_connector_metadata
The connector subclasses vLLM's KVConnectorBase_V1 when vLLM is importable, and a stand-in
with the same methods and signatures (ferry/vllm/_base.py) when not: tests/vllm drives it in
vLLM's call order without vLLM.

kv_connector_extra_config keys: ferry_socket (the node's agent; default $FERRY_SOCKET),
lease_s (120), heartbeat_s (lease_s / 4), pull_timeout_s (30), max_tp_ratio (8: decode TP up
to 8 x prefill TP), tp_rank (only without vLLM: this worker's TP rank).

KV caches may be CUDA tensors (registered by CUDA IPC), CPU tensors in shared memory, or
tensors in the agent's own memory from client(socket).empty(..., device="cuda:N") (a
simulated GPU's pool): ferry.vllm.client(socket) is the Client the workers of a process
use."""

import logging

from . import tp_mapping  # noqa: F401
from ._base import (HAVE_VLLM, KVConnectorBase_V1, KVConnectorHandshakeMetadata,
                    KVConnectorMetadata, KVConnectorRole)
from .compat import compat_hash, geometry  # noqa: F401
from .metadata import FerryConnectorMetadata, FerryHandshake  # noqa: F401
from .scheduler import SchedulerSide
from .worker import WorkerSide, client

__all__ = ["FerryConnector", "FerryConnectorMetadata", "FerryHandshake", "KVConnectorRole",
           "HAVE_VLLM", "client"]

log = logging.getLogger("ferry.vllm")


def _tp_rank(vllm_config, extra):
    try:  # pragma: no cover - with vLLM
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return int(get_tensor_model_parallel_rank())
    except Exception:  # noqa: B902 - no vLLM, or no TP group (tests)
        return int(extra.get("tp_rank", getattr(vllm_config.parallel_config, "rank", 0)))


class FerryConnector(KVConnectorBase_V1):
    """One per process: role SCHEDULER in the engine core, WORKER in each model runner."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        kt = vllm_config.kv_transfer_config
        extra = dict(getattr(kt, "kv_connector_extra_config", None) or {})
        self.engine_id = str(getattr(kt, "engine_id", None) or "engine")
        self.connector_scheduler = self.connector_worker = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = SchedulerSide(vllm_config, self.engine_id, extra)
        else:
            tp = int(vllm_config.parallel_config.tensor_parallel_size)
            self.connector_worker = WorkerSide(vllm_config, self.engine_id, extra,
                                               _tp_rank(vllm_config, extra), tp)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return "HND"  # a run of heads is contiguous: heterogeneous TP reads head slices

    # --- scheduler side -----------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.connector_scheduler.get_num_new_matched_tokens(request,
                                                                   num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.connector_scheduler.update_state_after_alloc(request, blocks,
                                                          num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self.connector_scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output):
        self.connector_scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self.connector_scheduler.request_finished(request, block_ids)

    def on_new_request(self, request):
        self.connector_scheduler.on_new_request(request)

    def set_xfer_handshake_metadata(self, metadata):
        if self.connector_scheduler is not None:
            self.connector_scheduler.set_xfer_handshake_metadata(metadata)

    # --- worker side --------------------------------------------------------------------

    def register_kv_caches(self, kv_caches):
        self.connector_worker.register_kv_caches(kv_caches)

    def get_handshake_metadata(self):
        return self.connector_worker.get_handshake_metadata()

    def start_load_kv(self, forward_context, **kwargs):
        """Starts this step's pulls and sends its heartbeats; returns without waiting."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, FerryConnectorMetadata)
        self.connector_worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name):
        """Nothing to wait for: a pulled request joins the batch only once get_finished
        reported it (WAITING_FOR_REMOTE_KVS), with every layer in place."""

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Nothing to save: decode pulls from prefill's own cache."""

    def wait_for_save(self):
        """Nothing to wait for (see save_kv_layer)."""

    def get_finished(self, finished_req_ids):
        return self.connector_worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        return self.connector_worker.get_block_ids_with_load_errors()

    def shutdown(self):
        if self.connector_worker is not None:
            self.connector_worker.shutdown()
