"""Memory you allocated yourself, block lists over it, and handles for moving blocks.

    reg = c.register(kv_k)                     # numpy over shared memory, torch after
                                               # share_memory_(), a CUDA tensor, a ferry buffer
    bl = c.prepare_blocks([k0, v0, k1, v1], block_bytes=32768, name="kv")  # exported as "kv"
    x = c.read_blocks("node-a", "kv", remote_ids, bl, local_ids, notify="req-7 pulled")
    x.wait(10)                                 # or x.done(), x.status(), x.cancel()
    x.failed()                                 # [(pair index, code, message), ...]
    heads = c.prepare_strided([(k0, base, stride, count, length)], name="kv.h2-4")
    parts = c.prepare_entries([(k0, offset, length), (v0, offset2, length2)])

prepare_blocks numbers blocks tensor by tensor: block j of the r-th tensor (or
registration) is index r * blocks_per_tensor + j; prepare_strided run by run (block k of a
run at base + k * stride), prepare_entries one block per entry, of any length. One call
moves any set of (local index -> remote index) pairs of equal lengths, across all layers,
as one transfer; the notification reaches the peer's agent once every block settled. A handle is a transfer id: thousands may be outstanding, and no thread
waits for any of them.
"""

import time

from .errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, from_status

__all__ = ["Registration", "BlockList", "Handle"]


class Registration:
    """Memory registered with the agent: a buffer id, an offset into it and a length.

    For memory you allocated (numpy, torch) the agent mapped or imported it and `owned` is
    True: Client.deregister ends it (as does the client's exit). For a ferry buffer it is
    the buffer itself, nothing is registered, and deregister does nothing. `keep` holds the
    tensor, so that its memory outlives the registration."""

    def __init__(self, buffer_id, length, offset=0, name="", device="host", owned=False,
                 keep=None):
        self.id = buffer_id
        self.offset = offset
        self.length = length
        self.name = name
        self.device = device
        self.owned = owned
        self._keep = keep

    def __repr__(self):
        return (f"Registration(id={self.id}, length={self.length}, device={self.device!r}"
                f"{', name=' + repr(self.name) if self.name else ''})")


class BlockList:
    """A prepared list of blocks (Client.prepare_blocks, prepare_entries, prepare_strided):
    `blocks` of them; from prepare_blocks numbered tensor by tensor, `blocks_per_tensor` each
    when they are alike (else None); exported as `name` when named."""

    def __init__(self, session, list_id, blocks, name, registrations, blocks_per_tensor):
        self._s = session
        self.id = list_id
        self.blocks = blocks
        self.name = name
        self.registrations = registrations
        self.blocks_per_tensor = blocks_per_tensor
        self._made = []  # registrations prepare_blocks made for tensors: released with it

    def __len__(self):
        return self.blocks

    def release(self):
        """Ends the list now, and the registrations prepare_blocks made for it (both also
        end with the client)."""
        if self.id:
            self._s.release_blocks(self.id)
            self.id = 0
        for reg in self._made:
            if reg.owned:
                self._s.deregister(reg.id)
                reg.owned = False
        self._made = []

    def __repr__(self):
        return f"BlockList(id={self.id}, blocks={self.blocks}, name={self.name!r})"


class Handle:
    """One MoveBlocks transfer: poll it, wait for it, cancel it. Op i is pair i."""

    def __init__(self, session, transfer_id, nbytes, keep=None, result=None):
        self._s = session
        self.id = transfer_id
        self.bytes = nbytes
        # Given when the move waited for it to end (still running if the call's time ran out).
        ended = result is not None and result["state"] != "running"
        self._result = result if ended else None
        # The block lists and their memory live until the transfer ended.
        self._keep = None if ended else keep

    def _poll(self):
        if self._result is None:
            r = self._s.transfer_result(self.id)
            if r["state"] != "running":
                self._result = r
                self._keep = None
            return r
        return self._result

    def done(self):
        """True once every block settled (succeeded, failed or cancelled)."""
        return self._poll()["state"] != "running"

    def status(self):
        """"running", "succeeded" or "failed"."""
        return self._poll()["state"]

    def wait(self, timeout=None):
        """Waits until it ended (`timeout` seconds; None: without limit) and returns self;
        raises DeadlineExceeded if still running, or the transfer's error if it failed."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            left = 0.5 if end is None else min(0.5, end - time.monotonic())
            if left <= 0:
                raise DeadlineExceeded(f"transfer {self.id} is still running")
            # The agent answers when it ends or `left` passes: short slices keep Ctrl-C alive.
            r = self._s.transfer_result(self.id, left)
            if r["state"] != "running":
                self._result = r
                self._keep = None
        r = self._result
        if r["state"] != "succeeded":
            raise from_status(r["code"] or 2, r["message"] or f"transfer {self.id} failed")
        return self

    def cancel(self):
        """Ends it: blocks not yet settled fail CANCELLED (those moved stay moved)."""
        self._s.cancel_transfer(self.id)

    def failed(self):
        """The pairs that failed, as (index, code, message), once it ended."""
        if not self.done():
            raise FailedPrecondition(f"transfer {self.id} is still running")
        return [tuple(f) for f in self._s.transfer_result(self.id, None, True)["failed"]]

    def result(self):
        """The transfer's figures once it ended (state, bytes, duration_us, ops_failed...)."""
        return dict(self._poll())

    def __repr__(self):
        return f"Handle(id={self.id}, bytes={self.bytes}, status={self.status()!r})"


def check_ids(ids, field):
    """A numpy uint64 vector of block indices; InvalidArgument naming `field` if not."""
    import numpy as np
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise InvalidArgument(f"{field}: must be a sequence of block indices")
    if arr.size and (arr.dtype.kind not in "iu" or (arr.dtype.kind == "i" and arr.min() < 0)):
        raise InvalidArgument(f"{field}: block indices are non-negative integers")
    return np.ascontiguousarray(arr, dtype=np.uint64)

