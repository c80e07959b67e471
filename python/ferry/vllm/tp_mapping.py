"""Which prefill ranks a decode rank reads, and which parts of whose blocks: pure functions
of the two TP sizes, so that both sides (and the tests) compute the same answer.

The caches are in the HND layout (ferry/vllm/compat.py): a block of one layer's K (or V) on
a rank holding H heads is H contiguous slices of block_size x head_size elements, so a run
of heads is one contiguous range. Prefill has P ranks, decode D, the model H KV heads:

- D == P: decode rank d reads prefill rank d's blocks whole.
- D > P (k = D / P): decode rank d reads slice d % k (of k equal slices, H / D heads each)
  of every block of prefill rank d // k. The prefill rank exports its blocks cut in k
  ("<base>.x<k>": block i is slice i % k of its block i // k), so one read of n pairs does
  it; k decode ranks read each prefill rank.
- P > D (k = P / D): decode rank d reads prefill ranks d*k .. d*k+k-1 whole, each into
  sub-chunk j of its own blocks (its list cut in k, as above), one read per prefill rank.
- MLA: every rank holds the same latent cache: decode rank d reads prefill rank d // (D/P)
  whole (D >= P), or prefill rank d*k whole and only notifies the k-1 others (P > D).

Each prefill rank hears from max(1, D / P) decode ranks: the last one frees its blocks."""

import collections

import numpy as np

Read = collections.namedtuple(
    "Read", "prefill_rank remote_split remote_slice local_split local_slice")


def check_sizes(prefill_tp, decode_tp, kv_heads, mla):
    """None when the two TP sizes can exchange blocks; else why not."""
    if prefill_tp <= 0 or decode_tp <= 0:
        return f"TP sizes must be positive (prefill {prefill_tp}, decode {decode_tp})"
    if prefill_tp % decode_tp and decode_tp % prefill_tp:
        return (f"prefill TP {prefill_tp} and decode TP {decode_tp}: one must divide the "
                "other")
    if not mla and (kv_heads % prefill_tp or kv_heads % decode_tp):
        return (f"{kv_heads} KV heads do not split evenly over prefill TP {prefill_tp} and "
                f"decode TP {decode_tp} (replicated KV heads are not supported)")
    return None


def reads(decode_rank, decode_tp, prefill_tp, mla):
    """The Reads decode rank `decode_rank` makes, one per prefill rank it reads."""
    d, D, P = decode_rank, decode_tp, prefill_tp
    if D >= P:
        k = D // P
        if mla or k == 1:
            return [Read(d // k, 1, 0, 1, 0)]
        return [Read(d // k, k, d % k, 1, 0)]
    k = P // D
    if mla:
        return [Read(d * k, 1, 0, 1, 0)]
    return [Read(d * k + j, 1, 0, k, j) for j in range(k)]


def notified(decode_rank, decode_tp, prefill_tp):
    """The prefill ranks decode rank `decode_rank` notifies when its reads ended (also those
    an MLA decode rank does not read, so that each frees its blocks)."""
    d, D, P = decode_rank, decode_tp, prefill_tp
    if D >= P:
        return [d // (D // P)]
    k = P // D
    return [d * k + j for j in range(k)]


def expected_notifications(decode_tp, prefill_tp):
    """How many decode ranks notify each prefill rank."""
    return max(1, decode_tp // prefill_tp)


def remote_splits(prefill_heads, most=8):
    """The slice counts a prefill rank holding `prefill_heads` heads exports lists for: every
    divisor k > 1 of its heads up to `most` (a decode TP of up to `most` x prefill TP)."""
    return [k for k in range(2, min(prefill_heads, most) + 1) if prefill_heads % k == 0]


def pair_ids(planes, local_blocks_per_plane, remote_blocks_per_plane, local_blocks,
             remote_blocks, read):
    """(local ids, remote ids) of one Read, for lists cut as the Read says: plane t (layer *
    planes-per-layer + K/V) block b slice s is list index (t * blocks + b) * split + s."""
    lb = np.asarray(local_blocks, dtype=np.uint64)[None, :]
    rb = np.asarray(remote_blocks, dtype=np.uint64)[None, :]
    t = np.arange(planes, dtype=np.uint64)[:, None]
    local = (t * np.uint64(local_blocks_per_plane) + lb) * np.uint64(read.local_split)
    remote = (t * np.uint64(remote_blocks_per_plane) + rb) * np.uint64(read.remote_split)
    return ((local + np.uint64(read.local_slice)).ravel(),
            (remote + np.uint64(read.remote_slice)).ravel())
