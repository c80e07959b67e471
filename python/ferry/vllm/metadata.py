"""What travels between the pieces of the connector: the handshake a worker gives its
scheduler, the kv_transfer_params prefill's finished request carries to decode (through
the proxy), the per-step metadata scheduler -> workers, and the notification names."""

import dataclasses

from ._base import KVConnectorHandshakeMetadata, KVConnectorMetadata

NOTIFY_ROOT = "ferry.vllm"


@dataclasses.dataclass
class FerryHandshake(KVConnectorHandshakeMetadata):
    """One worker rank, once its caches are registered: where its blocks are and how they
    are cut. The scheduler puts every rank's into the kv_transfer_params it hands out."""
    node: str          # the rank's ferry agent (a node name peers know)
    list_base: str     # "<base>.x1" is its exported block list, "<base>.x<k>" cut in k
    tp_rank: int
    tp_size: int
    num_blocks: int    # blocks per plane (per layer's K or V)
    splits: list       # the k of every "<base>.x<k>" it exports


@dataclasses.dataclass
class RecvRequest:
    """Decode: pull `remote_block_ids` of the prefill request into `local_block_ids` (empty:
    pull nothing, only tell prefill to free its blocks)."""
    params: dict
    local_block_ids: list


@dataclasses.dataclass
class FerryConnectorMetadata(KVConnectorMetadata):
    # decode: request id -> what to pull this step
    reqs_to_recv: dict = dataclasses.field(default_factory=dict)
    # prefill: request id -> lease in seconds, for requests whose blocks wait for decode
    reqs_to_send: dict = dataclasses.field(default_factory=dict)
    # decode: request id -> params, for requests whose prefill blocks must stay leased
    reqs_to_renew: dict = dataclasses.field(default_factory=dict)


def transfer_params(handshakes, request_id, block_ids, compat, geometry, lease_s):
    """The kv_transfer_params of a prefill request whose blocks wait to be pulled."""
    ranks = [handshakes[r] for r in sorted(handshakes)]
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_request_id": request_id,
        "remote_block_ids": list(block_ids),
        "remote_tp_size": len(ranks),
        "remote_ranks": [[h.node, h.list_base, h.num_blocks, list(h.splits)] for h in ranks],
        "compat_hash": compat,
        "geometry": dict(geometry),
        "lease_s": lease_s,
    }


def notify_prefix(list_base_of_rank0, prefill_rank):
    """What prefill rank `prefill_rank` polls for: every notification about its blocks."""
    engine = list_base_of_rank0.rsplit(".r", 1)[0]  # "vllm.<engine id>.r<rank>"
    engine = engine[len("vllm."):] if engine.startswith("vllm.") else engine
    return f"{NOTIFY_ROOT}/{engine}/p{prefill_rank}/"


def done_name(prefix, request_id, decode_rank, expected):
    return f"{prefix}{request_id}/d{decode_rank}of{expected}"


def heartbeat_name(prefix, request_id):
    return f"{prefix}{request_id}/hb"


def parse(prefix, name):
    """(request id, decode rank or None for a heartbeat, expected count), or None when the
    name is not one of ours."""
    if not name.startswith(prefix) or "/" not in name[len(prefix):]:
        return None
    request_id, tag = name[len(prefix):].rsplit("/", 1)
    if tag == "hb":
        return request_id, None, 0
    if tag.startswith("d") and "of" in tag:
        rank, _, expected = tag[1:].partition("of")
        if rank.isdigit() and expected.isdigit():
            return request_id, int(rank), int(expected)
    return None
