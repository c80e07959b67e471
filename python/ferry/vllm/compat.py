"""The compatibility hash: what must be equal on both sides for a decode rank to read a
prefill rank's blocks as its own KV cache.

It covers the model, the KV dtype, the number of layers, the total number of KV heads, the
head size, the block size (tokens per block), the physical layout (HND: heads outside
tokens inside a block, so that a head slice of a block is one contiguous range) and whether
the cache is MLA's (one latent vector per token, the same on every TP rank). TP sizes are
not in it: the two sides may differ (ferry/vllm/tp_mapping.py)."""

import hashlib
import json

LAYOUT = "HND"


def geometry(vllm_config):
    """The hashed fields, read from a VllmConfig (or an object with the same attributes)."""
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    dtype = getattr(cache, "cache_dtype", "auto")
    if dtype in (None, "auto"):
        dtype = model.dtype
    return {
        "model": str(model.model),
        "dtype": str(dtype).replace("torch.", ""),
        "layers": int(model.get_num_layers(parallel)),
        "kv_heads": int(model.get_total_num_kv_heads()),
        "head_size": int(model.get_head_size()),
        "block_size": int(cache.block_size),
        "layout": LAYOUT,
        "mla": bool(getattr(model, "use_mla", False)),
    }


def compat_hash(fields):
    """sha256 over the fields as canonical JSON, hex, first 16 bytes."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def differences(mine, theirs):
    """The fields that differ, as 'name: mine vs theirs', for the message of a mismatch."""
    if not isinstance(theirs, dict):
        return ["geometry: the prefill side sent none"]
    keys = sorted(set(mine) | set(theirs))
    return [f"{k}: {mine.get(k)!r} here, {theirs.get(k)!r} there" for k in keys
            if mine.get(k) != theirs.get(k)]
