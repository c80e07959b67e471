"""Client calls on memory you allocated (registrations) and block lists over it: prepare
them, and move blocks between them and a peer's lists (read_blocks, write_blocks)."""

from . import _ferry
from ._calls import _same, _seconds
from ._dtypes import _is_torch, _np
from ._notifications import _payload
from .blocks import BlockList, Handle, Registration, check_ids
from .buffers import Buffer
from .errors import Error, InvalidArgument


class _BlockCalls:
    """Client's registration and block-list calls."""

    def register(self, t, name=None, allowed_peers=()):
        """Registers memory you allocated, so transfers move it in place: a numpy array over
        shared memory (multiprocessing.shared_memory, a memfd or /dev/shm mapping), a torch
        CPU tensor after share_memory_(), a CUDA torch tensor (by CUDA IPC handle), or a
        ferry buffer / a view of one (nothing to register; it keeps its own name). `name`
        exports the memory to peers (as Client.alloc's name). Private memory (a plain numpy
        array, malloc) raises FailedPrecondition saying how to share it. Returns a
        Registration, which belongs to this run of the agent (AgentRestarted ends it)."""
        if isinstance(t, (Buffer, _ferry.Buffer)):
            self._check_mine(t, "t")
        reg = self._register(t, name, allowed_peers)
        reg._session = self._s
        if reg.owned:
            self._s.track("registrations", reg)
        return reg

    def _register(self, t, name=None, allowed_peers=()):
        name = name or ""
        peers = [str(p) for p in allowed_peers]
        if isinstance(t, (Buffer, _ferry.Buffer)):
            raw = t.raw if isinstance(t, Buffer) else t
            return Registration(raw.id, raw.size, 0, raw.name, raw.device, keep=raw)
        if _is_torch(t):
            if not t.is_contiguous():
                raise InvalidArgument("tensor: must be contiguous (call .contiguous() first)")
            nbytes = t.numel() * t.element_size()
            if t.device.type == "cuda":
                home = self._locate(t.data_ptr(), max(nbytes, 1), any_device=True)
                if home is not None:  # a view of a ferry GPU buffer
                    buf, offset = home
                    return Registration(buf.id, nbytes, offset, buf.name, buf.device,
                                        keep=(t, buf))
                return self._register_cuda(t, nbytes, name, peers)
            address = t.data_ptr()
        else:
            np = _np()
            arr = np.asarray(t)
            if not arr.flags.c_contiguous:
                raise InvalidArgument("array: must be C-contiguous (np.ascontiguousarray)")
            address, nbytes = arr.__array_interface__["data"][0], arr.nbytes
        home = self._locate(address, max(nbytes, 1))
        if home is not None:  # a ferry buffer's memory: the buffer, under its own name
            buf, offset = home
            return Registration(buf.id, nbytes, offset, buf.name, buf.device, keep=(t, buf))
        r = self._s.register_memory(address, nbytes, name, peers)
        # A range this session registered already is that registration, its first owner's.
        return Registration(r["id"], nbytes, 0, r["name"], r["device"], owned=not r["existing"],
                            keep=t)

    def _register_cuda(self, t, nbytes, name, peers):
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        # torch's own IPC sharing: (device, handle of the caching allocator's block, size,
        # offset of the storage in that block, ...).
        shared = storage._share_cuda_()
        device, handle, offset = shared[0], shared[1], shared[3]
        offset += t.storage_offset() * t.element_size()
        r = self._s.register_cuda_ipc(handle, offset, nbytes, f"cuda:{device}", name, peers)
        return Registration(r["id"], nbytes, 0, r["name"], r["device"], owned=not r["existing"],
                            keep=t)

    def deregister(self, reg):
        """Ends a registration (transfers in flight keep the memory until they finish)."""
        if reg.owned:
            self._check_mine(reg, f"registration {reg.id}")
            self._s.deregister(reg.id)
            reg.owned = False

    def prepare_blocks(self, regs_or_tensors, block_bytes, name=None):
        """A block list over registrations or tensors (tensors are registered here, named
        "<name>.<r>" when the list is named), each cut into blocks of `block_bytes`: block j
        of the r-th is index r * blocks_per_tensor + j. `name` exports the list to peers,
        which then read or write its blocks by index. Returns a BlockList."""
        block_bytes = int(block_bytes)
        if block_bytes <= 0:
            raise InvalidArgument("block_bytes: must be positive")

        def extents(regs, which):
            if not regs:
                raise InvalidArgument("regs_or_tensors: no memory to cut into blocks")
            rows = []
            for r, g in enumerate(regs[k] for k in which):
                if g.length < block_bytes:
                    raise InvalidArgument(f"regs_or_tensors[{r}]: {g.length} bytes is less than "
                                          f"one block of {block_bytes}")
                rows.append((g.id, g.offset, block_bytes, g.length // block_bytes, 0))
            return rows

        return self._prepare(list(regs_or_tensors), extents, name, per_item=True)

    def prepare_entries(self, entries, name=None):
        """A block list of arbitrary entries: `entries` is a sequence of
        (registration_or_tensor, offset, length), and block i is [offset, +length) of entry
        i's memory; entries may differ in length (a move pairs blocks of equal lengths only).
        Tensors are registered here, once each however many entries name them ("<name>.<r>"
        for the r-th when the list is named). `name` exports the list. Returns a BlockList."""
        entries = _rows(entries, 3, "entries", "(registration_or_tensor, offset, length)")
        # An entry is a run of one block.
        return self._prepare_runs([(t, offset, length, 1, length)
                                   for t, offset, length in entries], "entries", name)

    def prepare_strided(self, runs, name=None):
        """A block list of strided runs: `runs` is a sequence of (registration_or_tensor, base,
        stride, count, length), each `count` blocks of `length` bytes at base + k * stride
        of its memory (stride >= length: a run's blocks never overlap), numbered run by run.
        E.g. the head slice [h0, h1) of every block of a (blocks, heads, tokens, dim) KV
        cache: base h0 * head_bytes, stride block_bytes, length (h1 - h0) * head_bytes.
        Tensors are registered here as by prepare_entries. Returns a BlockList."""
        runs = _rows(runs, 5, "runs", "(registration_or_tensor, base, stride, count, length)")
        return self._prepare_runs(runs, "runs", name)

    def _prepare_runs(self, runs, field, name):
        """prepare_strided's list from (item, base, stride, count, length) rows; errors name
        `field`[i] (the caller's argument)."""

        def extents(regs, which):
            if not runs:
                raise InvalidArgument(f"{field}: no blocks")
            rows = []
            for i, (_, base, stride, count, length) in enumerate(runs):
                g = regs[which[i]]
                base, stride, count, length = int(base), int(stride), int(count), int(length)
                if count <= 0:
                    raise InvalidArgument(f"{field}[{i}].count: must be positive")
                if count > 1 and stride < length:
                    raise InvalidArgument(f"{field}[{i}].stride: {stride} is less than length "
                                          f"{length} (a run's blocks may not overlap)")
                _check_range(f"{field}[{i}]", g, base, length, count, stride)
                rows.append((g.id, g.offset + base, length, count, stride if count > 1 else 0))
            return rows

        return self._prepare([r[0] for r in runs], extents, name)

    def _prepare(self, items, extents, name, per_item=False):
        """Registers `items` (a tensor named twice once), builds the rows (buffer, offset,
        block_bytes, count, stride) by extents(regs, which) (which[i]: items[i]'s index in
        regs) and prepares the list; what it registered goes with it on failure. `per_item`:
        a row per item, whose common count is the list's blocks_per_tensor."""
        regs, which, made, seen = [], [], [], {}
        try:
            for item in items:
                if isinstance(item, Registration):
                    key = ("reg", id(item))
                else:
                    key = ("tensor", id(item))
                if key not in seen:
                    if isinstance(item, Registration):
                        self._check_mine(item, f"registration {item.id}")
                        reg = item
                    else:
                        reg = self.register(item, name=f"{name}.{len(regs)}" if name else None)
                        if reg.owned:
                            made.append(reg)
                    seen[key] = len(regs)
                    regs.append(reg)
                which.append(seen[key])
            rows = extents(regs, which)
            np = _np()
            list_id, blocks = self._s.prepare_blocks(np.array(rows, dtype=np.uint64).reshape(-1, 5),
                                                     name or "")
        except BaseException:
            for reg in made:  # what this call registered goes with it
                self.deregister(reg)
            raise
        counts = {row[3] for row in rows}
        bl = BlockList(self._s, list_id, blocks, name or "", regs,
                       counts.pop() if per_item and len(counts) == 1 else None)
        self._s.track("lists", bl)
        bl._made = made
        return bl

    def read_blocks(self, peer, remote_list_name, remote_ids, bl, local_ids, notify="",
                    timeout=60.0, verify=False, wait=False, notify_payload=b""):
        """Pulls blocks remote_ids[i] of the peer's list `remote_list_name` into blocks
        local_ids[i] of `bl`, all in one transfer; `notify` (if set) is delivered to the
        peer's agent once every block settled, with `notify_payload` (bytes, at most 4096:
        Notification.payload there). `timeout`: seconds for the transfer, the peer's answer
        for its list included (None or <= 0: the agent's default; a peer that does not answer
        in time raises DeadlineExceeded naming it, "node-b did not answer ResolveBlocks
        within 3 s"). `verify`: once the bytes moved, both agents checksum
        every block (CRC32C) and a pair whose blocks differ fails (DataLoss, by index).
        Returns a Handle at once; with `wait`, once the transfer ended, in one call to the
        agent (the quickest way to move a few blocks; Handle.wait() then returns at once,
        or raises the transfer's error). That call is not interrupted by Ctrl-C: it ends
        with the transfer, or just before `timeout` + 10 s with the handle still running."""
        return self._move_blocks("read", bl, local_ids, peer, remote_list_name, remote_ids,
                                 notify, timeout, verify, wait, notify_payload)

    def _move_blocks(self, kind, bl, local_ids, peer, remote_list_name, remote_ids, notify="",
                     timeout=60.0, verify=False, wait=False, notify_payload=b""):
        self._check_mine(bl, "bl")
        local = check_ids(local_ids, "local_ids")
        remote = check_ids(remote_ids, "remote_ids")
        payload = _payload(notify_payload, notify)
        # None or <= 0: the agent's default timeout (a transfer always has one).
        timeout_ms = 0 if timeout is None or timeout <= 0 else max(int(timeout * 1000), 1)
        try:
            tid, nbytes, ended = self._s.move_blocks(kind, bl.id, local, peer, remote_list_name,
                                                     remote, notify or "", timeout_ms,
                                                     bool(verify), bool(wait), payload)
        except Error as e:
            # The agent names the request's fields; say them as this call's arguments.
            message = (str(e.args[0]).replace("local_blocks", "local_ids")
                       .replace("remote_blocks", "remote_ids").replace("remote_list",
                                                                        "remote_list_name"))
            raise type(e)(message, e.code) from None
        return Handle(self._s, tid, nbytes, keep=bl, result=ended)

    def _start_write_blocks(self, buffer, peer, remote_buffer, blocks, notify="", timeout=60.0,
                            notify_payload=b"", _ended=()):
        buffer_id = buffer if isinstance(buffer, int) else buffer.id
        payload = _payload(notify_payload, notify)
        np = _np()
        arr = np.asarray(blocks, dtype=np.uint64)
        if arr.ndim == 1 and arr.size == 0:
            arr = arr.reshape(0, 3)
        call = self._s.write_blocks(buffer_id, peer, remote_buffer, arr, notify,
                                    _seconds(timeout), *_ended, notification_payload=payload)
        return call, _same, buffer

    def write_blocks(self, *args, **kwargs):
        """Two forms.

        write_blocks(bl, local_ids, peer, remote_list_name, remote_ids, notify="",
        timeout=60.0, verify=False, wait=False) -> Handle: pushes blocks local_ids[i] of
        block list `bl` into blocks remote_ids[i] of the peer's list, as read_blocks pulls;
        returns at once (with wait=True, once it ended).

        write_blocks(buffer, peer, remote_buffer, blocks, notify="", timeout=60.0): writes
        (local_offset, remote_offset, length) blocks of `buffer` into the peer's named
        buffer, then notifies `notify` there once every block landed; returns then."""
        if (args and isinstance(args[0], BlockList)) or "bl" in kwargs:
            return self._move_blocks("write", *args, **kwargs)
        return self._wait(self._start_write_blocks(*args, **kwargs))

    def write_blocks_async(self, buffer, peer, remote_buffer, blocks, **kwargs):
        return self._async(self._start_write_blocks, buffer, peer, remote_buffer, blocks,
                           **kwargs)


def _check_range(field, reg, offset, length, count, stride):
    """InvalidArgument naming `field` unless `count` blocks of `length` bytes at offset +
    k * stride lie in `reg` (its own length: a registration may be part of a buffer)."""
    if offset < 0 or length <= 0 or stride < 0:
        raise InvalidArgument(f"{field}: offset, length and stride must be non-negative, the "
                              f"length positive")
    end = offset + (count - 1) * stride + length
    if end > reg.length:
        raise InvalidArgument(f"{field}: its blocks end at byte {end}, past the {reg.length} "
                              f"bytes of {reg!r}")


def _rows(items, width, field, shape):
    """`items` as a list, each a tuple or list of `width`; InvalidArgument naming field[i]."""
    items = list(items)
    for i, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != width:
            raise InvalidArgument(f"{field}[{i}]: must be {shape}")
    return items
