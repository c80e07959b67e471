"""What travels between the pieces of the connector: the handshake a worker gives its
scheduler, the kv_transfer_params prefill's finished request carries to decode (through
the proxy), the per-step metadata scheduler -> workers, and the notification names."""

import dataclasses
import json

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


# A notification says what it is in its payload (JSON), so that a request id needs no escaping
# in a name and one heartbeat renews every request a decode rank still wants from a prefill
# rank: name "<prefix>done", payload {"req": id, "rank": decode rank, "of": how many decode
# ranks notify}; name "<prefix>hb", payload {"reqs": [id, ...]}.
MAX_PAYLOAD = 4096  # what the agent carries with a notification (ferry.MAX_NOTIFY_PAYLOAD)


def done(prefix, request_id, decode_rank, expected):
    """(name, payload) of decode rank `decode_rank`'s word that it is done with a request."""
    body = {"req": request_id, "rank": decode_rank, "of": expected}
    return f"{prefix}done", json.dumps(body, separators=(",", ":")).encode()


def heartbeats(prefix, request_ids):
    """(name, payload) pairs renewing the leases of `request_ids`, as few as fit 4 KiB each."""
    out, batch = [], []
    for rid in request_ids:
        if batch and len(_hb_payload(batch + [rid])) > MAX_PAYLOAD:
            out.append((f"{prefix}hb", _hb_payload(batch)))
            batch = []
        batch.append(rid)
    if batch:
        out.append((f"{prefix}hb", _hb_payload(batch)))
    return out


def _hb_payload(request_ids):
    return json.dumps({"reqs": list(request_ids)}, separators=(",", ":")).encode()


def parse(prefix, name, payload):
    """[(request id, decode rank or None for a heartbeat, expected count)] that a notification
    says, or None when it is not one of ours (another name, or a payload that is not ours)."""
    try:
        body = json.loads(bytes(payload).decode()) if payload else None
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    if name == f"{prefix}done":
        rid, rank, expected = body.get("req"), body.get("rank"), body.get("of")
        if (isinstance(rid, str) and isinstance(rank, int) and isinstance(expected, int)
                and 0 <= rank and 0 < expected):
            return [(rid, rank, expected)]
    elif name == f"{prefix}hb":
        rids = body.get("reqs")
        if isinstance(rids, list) and all(isinstance(r, str) for r in rids):
            return [(rid, None, 0) for rid in rids]
    return None
