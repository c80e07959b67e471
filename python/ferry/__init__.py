"""ferry: tensors between machines, one call away.

    import ferry, numpy as np
    c = ferry.Client()                       # ferry.default_socket(): $FERRY_SOCKET, else
                                             # /tmp/ferryd-<host>.sock
    x = c.empty((1024, 1024), "float32")     # a numpy array in agent shared memory
    x[:] = 1.0
    c.send(x, "node-b", "grad/0")            # lands straight in node-b's buffer
    # on node-b
    y = c.recv("node-a", "grad/0")           # numpy view of the landing buffer (no copy)
    t = c.recv("node-a", "grad/1", like="torch")

Tensors that live in an agent buffer (Client.alloc / Client.empty) are sent without a copy;
any other numpy array or torch tensor is first copied into a temporary agent buffer.
Received tensors are zero-copy views of the buffer they landed in; the buffer is freed when
the last view is collected. Every blocking call has a `timeout` (seconds) and an `_async`
twin returning a ferry.Future whose cancel() cancels the transfer at the agent (the peer
learns); `timeout=None` waits without limit, and Ctrl-C interrupts a blocking call (it is
cancelled at the agent). Errors raise ferry.Error subclasses carrying the gRPC status code
and message.
"""

import atexit
import collections
import concurrent.futures
import itertools
import os as _os
import threading
import weakref

from . import _ferry
from . import launch
from . import session as _session
from .blocks import BlockList, Handle, Registration, check_ids
from .errors import (AgentRestarted, Aborted, AlreadyExists, Cancelled, DataLoss,
                     DeadlineExceeded, Error, FailedPrecondition, Internal, InvalidArgument,
                     NotFound, OutOfRange,
                     PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable,
                     Unimplemented, Unknown, from_status)

__version__ = _ferry.__version__

__all__ = ["Client", "Buffer", "Future", "Notification", "Registration", "BlockList", "Handle",
           "Op", "TransferResult", "OpResult", "BufferInfo", "PolicyState",
           "empty", "DTYPES", "Error", "Cancelled", "Unknown",
           "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
           "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
           "OutOfRange", "Unimplemented", "Internal", "Unavailable", "AgentRestarted", "DataLoss",
           "Unauthenticated", "launch", "default_socket", "__version__"]

DTYPES = ("float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64",
          "float8_e4m3fn", "float8_e5m2", "float64", "int16", "bool")

# numpy has no bfloat16 / float8: their bytes are viewed as unsigned integers of the same size.
_NUMPY_VIEW = {"bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}

# A notification: `payload` is what the sender gave with it (notify_payload; b"" when none),
# `code` and `message` how its batch went (0: it landed), `list` / `buffer` what it landed in.
Notification = collections.namedtuple(
    "Notification", "name from_node bytes blocks sequence code message list buffer payload",
    defaults=(0, "", "", "", b""))
# What a notification may carry (notify_payload), as the agent allows.
MAX_NOTIFY_PAYLOAD = 4096


def _payload(notify_payload, notify):
    """notify_payload as bytes, checked here as the agent would (InvalidArgument naming it)."""
    payload = bytes(notify_payload or b"")
    if len(payload) > MAX_NOTIFY_PAYLOAD:
        raise InvalidArgument(f"notify_payload: {len(payload)} bytes is more than "
                              f"{MAX_NOTIFY_PAYLOAD}")
    if payload and not notify:
        raise InvalidArgument("notify_payload: a payload travels with a notification; name one "
                              "(notify=...)")
    return payload

# One op of Client.run: "write" moves [local_offset, +length) of `local` (a Buffer, a
# Registration or a buffer id) to the peer's buffer `remote_buffer` at remote_offset; "read"
# the reverse. The peer may be this agent's own node.
Op = collections.namedtuple("Op", "type local local_offset peer remote_buffer remote_offset length")
# Client.run's answer; `ops` (with include_ops=True) holds OpResults, in the batch's order.
TransferResult = collections.namedtuple(
    "TransferResult", "transfer_id state code message bytes bytes_total duration_us ops_total "
    "ops_failed policy_generation ops")
OpResult = collections.namedtuple("OpResult",
                                  "index code message bytes provider duration_us legs")
BufferInfo = collections.namedtuple(
    "BufferInfo", "id name size device backend owner persist registered allowed_peers")
PolicyState = collections.namedtuple(
    "PolicyState", "generation gdr gdr_max_path fallback staging_chunk_bytes staging_depth "
    "overrides")
_OP_TYPES = {"write": 1, "read": 2}


def _np():
    import numpy
    return numpy


def _torch():
    import torch
    return torch


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _torch_dtypes():
    torch = _torch()
    table = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
             torch.float64: "float64", torch.int8: "int8", torch.uint8: "uint8",
             torch.int16: "int16", torch.int32: "int32", torch.int64: "int64",
             torch.bool: "bool"}
    for name in ("float8_e4m3fn", "float8_e5m2"):  # newer torch only
        if hasattr(torch, name):
            table[getattr(torch, name)] = name
    return table


def dtype_name(dtype):
    """ferry's name for a numpy dtype, torch dtype or string; InvalidArgument if unknown."""
    if isinstance(dtype, str):
        return _ferry.dtype_name(dtype)
    if type(dtype).__module__.startswith("torch"):
        name = _torch_dtypes().get(dtype)
        if name is None:
            raise InvalidArgument(f"dtype: unknown dtype '{dtype}'")
        return name
    return _ferry.dtype_name(_np().dtype(dtype).name)


class Buffer:
    """An agent buffer mapped into this process (host shared memory)."""

    def __init__(self, raw):
        self._raw = raw

    id = property(lambda self: self._raw.id)
    name = property(lambda self: self._raw.name)
    size = property(lambda self: self._raw.size)
    device = property(lambda self: self._raw.device)
    address = property(lambda self: self._raw.address)

    def __len__(self):
        return self._raw.size

    def __buffer__(self, flags):  # Python 3.12+; older versions use memoryview(buf.raw)
        return memoryview(self._raw)

    @property
    def raw(self):
        """The compiled buffer object (buffer protocol, DLPack)."""
        return self._raw

    def free(self):
        """Frees the agent buffer now (views become invalid)."""
        self._raw.free()

    def numpy(self, dtype="uint8", shape=None, offset=0, strides=None):
        """A zero-copy numpy view. `strides` in elements; bfloat16/float8 view as uint16/uint8."""
        np = _np()
        name = dtype_name(dtype)
        itemsize = _ferry.dtype_size(name)
        if shape is None:
            shape = ((self.size - offset) // itemsize,)
        shape = tuple(int(d) for d in shape)
        span = _ferry.span_bytes(name, list(shape), list(strides or ()))
        if offset + span > self.size:
            raise OutOfRange(f"tensor: {list(shape)} {name} at offset {offset} needs {span} "
                             f"bytes; buffer {self.id} has {self.size}")
        np_dtype = np.dtype(_NUMPY_VIEW.get(name, name))
        base = np.frombuffer(self._raw, dtype=np.uint8, count=span, offset=offset).view(np_dtype)
        if not strides:
            return base.reshape(shape)
        return np.lib.stride_tricks.as_strided(
            base, shape=shape, strides=tuple(s * itemsize for s in strides))

    def torch(self, dtype="uint8", shape=None, offset=0, strides=None):
        """A zero-copy torch tensor through DLPack ("cuda:N" buffers give CUDA tensors)."""
        torch = _torch()
        name = dtype_name(dtype)
        if shape is None:
            shape = ((self.size - offset) // _ferry.dtype_size(name),)
        capsule = self._raw.dlpack(name, [int(d) for d in shape], [int(s) for s in strides or ()],
                                   offset)
        t = torch.utils.dlpack.from_dlpack(capsule)
        # DLPack (as torch 1.13 reads it) has no bool or float8: they travel as uint8.
        if name == "bool":
            t = t.view(torch.bool)
        elif name.startswith("float8") and hasattr(torch, name):
            t = t.view(getattr(torch, name))
        return t


class Future:
    """The result of an _async call. cancel() cancels the call at the agent, even running.

    No thread waits for the call: gRPC reports its end and the client's completer thread
    completes the future, running add_done_callback functions there (keep them short, they
    hold up the other futures)."""

    def __init__(self):
        self._future = concurrent.futures.Future()
        # Running from the start: cancel() is the agent's business, not an executor's.
        self._future.set_running_or_notify_cancel()
        self._call = None  # _ferry.Call, until the future is complete
        self._finish = None  # the blocking call's result from the Call's
        self._keep = None  # what must live until the call ends (the tensor, a staging buffer)

    def result(self, timeout=None):
        return self._future.result(timeout)

    def exception(self, timeout=None):
        return self._future.exception(timeout)

    def done(self):
        return self._future.done()

    def add_done_callback(self, fn):
        self._future.add_done_callback(lambda _: fn(self))

    def cancel(self):
        """Cancels the call; True unless it had already finished. The future then ends with
        ferry.Cancelled (or its result, if the call had just completed)."""
        call = self._call
        if call is None or self._future.done():
            return False
        call.cancel()
        return True

    def _attach(self, started):
        self._call, self._finish, self._keep = started

    def _fail(self, error):
        self._future.set_exception(error)

    def _complete(self):
        """Called once the call ended (call.result() does not wait then)."""
        try:
            value = self._finish(self._call.result())
        except BaseException as e:  # noqa: B902 - the future carries whatever it raised
            self._future.set_exception(e)
        else:
            self._future.set_result(value)
        # After the result is set: cancel() reads _call to know the future is not done.
        self._call = self._finish = self._keep = None


class _Completer:
    """One thread per client that completes its futures: gRPC pushes the key of each call
    that ended to a _ferry.Completions queue, and this thread takes them from it."""

    def __init__(self):
        self.queue = _ferry.Completions()
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self._futures = {}  # key -> Future whose call is running
        self._early = set()  # keys of calls that ended before their future was tracked
        self._thread = None
        self._closed = False
        self._orphaned = False  # the client was collected: end once nothing is outstanding

    def key(self):
        """A key for a call about to start; starts the thread on first use."""
        with self._lock:
            if self._closed:
                raise FailedPrecondition("client: closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ferry-completer",
                                                daemon=True)
                self._thread.start()
                _completers.add(self)
            return next(self._keys)

    def track(self, key, future):
        """From the caller, once the call started: its end may have been reported already."""
        with self._lock:
            ended = key in self._early
            if ended:
                self._early.discard(key)
            else:
                self._futures[key] = future
        if ended:
            future._complete()

    def _run(self):
        while True:
            keys = self.queue.next()  # the GIL released while it waits
            if not keys:
                return
            for key in keys:
                self._ended(key)
            with self._lock:
                if self._orphaned and not self._futures:
                    return

    def _ended(self, key):
        # A method of its own: a local of _run would keep the last future (and a received
        # buffer) alive until the next call ends.
        with self._lock:
            future = self._futures.pop(key, None)
            if future is None:
                self._early.add(key)
        if future is not None:
            future._complete()

    def orphan(self):
        """The client is gone: the thread ends once its last future completed (futures
        outlive their client)."""
        with self._lock:
            self._orphaned = True
            idle = not self._futures
        if idle:
            self.queue.close()

    def close(self, wait=True):
        """Stops the thread; with `wait`, once every outstanding future completed."""
        with self._lock:
            self._closed = True
            pending = [f._future for f in self._futures.values()]
            thread = self._thread
        if wait and pending:
            concurrent.futures.wait(pending)
        self.queue.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=None if wait else 1.0)


# At exit, before the interpreter stops its threads: a completer thread must not be woken
# into a finalizing interpreter.
_completers = weakref.WeakSet()


@atexit.register
def _stop_completers():
    for completer in list(_completers):
        completer.close(wait=False)


def _seconds(timeout):
    """A timeout for _ferry: seconds as a float, or None (no limit)."""
    return None if timeout is None else float(timeout)


def _same(result):
    return result


# Names of the registrations that CUDA tensors outside agent memory land in (recv's out=).
_landings = itertools.count(1)


def default_socket():
    """The socket ferry.Client() connects to: $FERRY_SOCKET when set, else
    /tmp/ferryd-<host name>.sock. The same rule as ferryctl and libferry."""
    return _ferry.default_socket()


class Client:
    """A connection to this node's agent."""

    def __init__(self, target=None, timeout=5.0):
        """Connects to the agent at `target`: a socket path, or HOST:PORT (its TCP listener).
        None: $FERRY_SOCKET, else /tmp/ferryd-<host name>.sock (ferryd's own default socket
        when its config names neither node nor socket). Raises ferry.Unavailable at once when
        the socket does not exist, naming it, or after `timeout` seconds with no answer."""
        target = target or default_socket()
        # The session, a new one each time the agent restarted (ferry/session.py).
        self._link = _session.Reconnect(target, timeout)
        self._lock = threading.Lock()
        self._buffers = weakref.WeakValueDictionary()  # id -> _ferry.Buffer: a tensor's home
        self._completer = _Completer()
        weakref.finalize(self, self._completer.orphan)

    @property
    def _s(self):
        """The current session (ferry.session.Session over a _ferry.Session)."""
        return self._link.current

    def _check_mine(self, obj, what):
        """FailedPrecondition if `obj` (a Registration, BlockList, Buffer or _ferry.Buffer)
        belongs to a session of an earlier run of the agent: its ids name nothing there, or
        another client's memory."""
        if isinstance(obj, (Buffer, _ferry.Buffer)):
            raw = obj.raw if isinstance(obj, Buffer) else obj
            if raw.session is not self._s.raw:
                raise FailedPrecondition(f"{what}: buffer {raw.id} belonged to an earlier "
                                         f"session of ferryd at {self._link.target}, which "
                                         f"restarted; allocate it again")
            return
        session = getattr(obj, "_s", None) or getattr(obj, "_session", None)
        if isinstance(session, _session.Session) and session is not self._s:
            session.check(what)

    def close(self):
        """Waits for the outstanding futures, then stops completing new ones."""
        self._completer.close(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- buffers ---------------------------------------------------------------------------

    def info(self):
        return self._s.info()

    @property
    def node(self):
        return self._s.info()["node"]

    def alloc(self, size, name="", device="host", allowed_peers=()):
        """A new agent buffer; named buffers can be written by peers (receive targets, KV
        caches): by the nodes in allowed_peers only, when it lists any. `device`: "host" or
        "cuda:N" (GPU N's pool; a simulated GPU's buffer is host memory here). Freed when the
        Buffer (and every view of it) is collected, or by free()."""
        device = "host" if device in ("host", "cpu", "") else str(device)
        buf = Buffer(self._s.alloc(int(size), name or "", [str(p) for p in allowed_peers],
                                   device))
        self._remember(buf)
        return buf

    def empty(self, shape, dtype="float32", name="", like="numpy", device="host"):
        """An uninitialised tensor in a fresh agent buffer, ready to send without a copy.
        `device` "cuda:N": in GPU N's pool (a torch CUDA tensor with like="torch"; on a
        simulated GPU, numpy or a CPU torch tensor over its memory)."""
        name_ = dtype_name(dtype)
        shape = tuple(int(d) for d in shape)
        nbytes = max(_ferry.span_bytes(name_, list(shape), []), 1)
        buf = self.alloc(nbytes, name, device)
        return buf.torch(name_, shape) if like == "torch" else buf.numpy(name_, shape)

    def _remember(self, buf):
        # The compiled object, not the wrapper: numpy / torch views keep only it alive.
        with self._lock:
            self._buffers[buf.id] = buf.raw
        self._s.track("buffers", buf.raw)

    def _describe(self, x, dtype=None):
        """(dtype name, shape, strides in elements or [], address, device) of a tensor."""
        if _is_torch(x):
            name = dtype_name(dtype) if dtype else dtype_name(x.dtype)
            shape = list(x.shape)
            strides = [] if x.is_contiguous() else list(x.stride())
            device = "host" if x.device.type == "cpu" else f"{x.device.type}:{x.device.index or 0}"
            return name, shape, strides, x.data_ptr(), device
        np = _np()
        x = np.asarray(x)
        if dtype:
            name = dtype_name(dtype)
            if _ferry.dtype_size(name) != x.dtype.itemsize:
                raise InvalidArgument(f"dtype: {name} does not match the array's "
                                      f"{x.dtype.itemsize}-byte elements")
        else:
            name = dtype_name(x.dtype.name) if x.dtype.name in DTYPES else None
            if name is None:
                raise InvalidArgument(f"dtype: unknown dtype '{x.dtype.name}' (known: "
                                      f"{', '.join(DTYPES)})")
        shape = list(x.shape)
        if x.flags.c_contiguous:
            strides = []
        else:
            if any(s < 0 or s % x.dtype.itemsize for s in x.strides):
                raise InvalidArgument("strides: negative or unaligned strides; copy the array")
            strides = [s // x.dtype.itemsize for s in x.strides]
        return name, shape, strides, x.__array_interface__["data"][0], "host"

    def _locate(self, address, span, any_device=False):
        """(_ferry.Buffer, offset) holding [address, address+span), or None. Host addresses
        are looked up among the buffers the CPU reaches; `any_device`: CUDA ones too."""
        with self._lock:
            buffers = list(self._buffers.values())
        current = self._s.raw
        for b in buffers:
            if b.session is not current:  # an earlier agent run's: its id names nothing now
                continue
            cpu = b.device == "host" or b.backend == "sim"
            if ((cpu or any_device) and b.address <= address
                    and address + span <= b.address + b.size):
                return b, address - b.address
        return None

    # --- tensors ---------------------------------------------------------------------------
    # Each call has a _start_* half that starts it and returns (call, finish, keep): the
    # _ferry.Call, the function that makes the blocking form's result from call.result(), and
    # what must live until the call ended. The blocking form waits on the call (Ctrl-C
    # cancels it); the _async form hands the three to a Future. `_ended`: (Completions, key)
    # of a future, or () for a blocking call.

    def send(self, tensor, peer, tag, timeout=60.0, dtype=None):
        """Sends a numpy array or torch tensor; returns once it landed at `peer`.
        `dtype` overrides the element type (e.g. "bfloat16" for a numpy uint16 array)."""
        return self._wait(self._start_send(tensor, peer, tag, timeout, dtype))

    def _start_send(self, tensor, peer, tag, timeout=60.0, dtype=None, _ended=()):
        name, shape, strides, address, device = self._describe(tensor, dtype)
        span = _ferry.span_bytes(name, shape, strides)
        home = self._home(tensor, address, span, device)
        if home is None:
            # Host memory not in agent memory: one copy into a temporary buffer, then a
            # zero-copy send.
            staging = self.alloc(max(span, 1))
            if _is_torch(tensor):
                staging.torch(name, shape).copy_(tensor)
            else:
                np = _np()
                np.copyto(staging.numpy(name, shape), np.asarray(tensor).view(
                    _NUMPY_VIEW.get(name, name)) if dtype else np.asarray(tensor))
            home, strides = (staging.raw.id, 0, staging.raw.device, staging.raw), []
        ident, offset, device, keep = home
        # meta.device is where the bytes are: the buffer's device (a simulated GPU's buffer
        # is host memory to numpy, yet cuda:N to the agent).
        call = self._s.send(ident, offset, name, shape, strides, device, peer, tag,
                            _seconds(timeout), *_ended)
        return call, _same, (tensor, keep)

    def _home(self, t, address, span, device, name="", peers=()):
        """(buffer id, offset, device, what to keep until the call ended) of the agent memory
        holding tensor `t`, or None for host memory outside it. A CUDA tensor outside agent
        memory is registered by CUDA IPC (named `name` for a receive, reachable by `peers`)
        for the call, which then moves it in place (no host copy); the registration ends
        once the call ended (when what it keeps goes)."""
        home = self._locate(address, max(span, 1), any_device=device != "host")
        if home is not None:
            buf, offset = home
            return buf.id, offset, buf.device, buf
        if device == "host":
            return None
        reg = self._register_cuda(t, span, name, list(peers))
        reg._session = self._s
        if reg.owned:
            _session.end_with(reg, self._s.raw)
        return reg.id, reg.offset, reg.device, reg

    def recv(self, peer, tag, out=None, dtype=None, shape=None, timeout=60.0, like="numpy"):
        """Receives tensor `tag` from `peer`. With `out` (a tensor in a *named* agent buffer,
        contiguous) it lands there and the sender's dtype and shape must match `out`;
        otherwise the agent allocates the landing buffer and this returns a zero-copy view
        (numpy, or torch with like="torch"). `dtype` / `shape` add expectations.
        `timeout=None` waits without limit."""
        return self._wait(self._start_recv(peer, tag, out, dtype, shape, timeout, like))

    def _start_recv(self, peer, tag, out=None, dtype=None, shape=None, timeout=60.0,
                    like="numpy", _ended=()):
        if out is not None:
            name, out_shape, strides, address, device = self._describe(out)
            span = _ferry.span_bytes(name, out_shape, strides)
            home = None
            if not strides:
                # A CUDA tensor outside agent memory lands in place: registered under a name
                # only `peer` may write, for this receive.
                home = self._home(out, address, span, device,
                                  name=f"recv/{_os.getpid()}/{next(_landings)}", peers=[peer])
            if home is None:
                raise FailedPrecondition("out: must be a contiguous tensor in a named ferry "
                                         "buffer (Client.alloc(size, name=...)) or on a GPU")
            ident, offset, _, keep = home
            call = self._s.recv(peer, tag, ident, offset, dtype_name(dtype) if dtype else name,
                                list(shape) if shape is not None else out_shape,
                                _seconds(timeout), *_ended)
            return call, lambda _: out, (out, keep)
        call = self._s.recv(peer, tag, 0, 0, dtype_name(dtype) if dtype else "",
                            list(shape) if shape is not None else None, _seconds(timeout),
                            *_ended)
        return call, lambda r: _received_view(r, like), None

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

    # --- one-sided transfers: ranges of named buffers, batches ---------------------------------

    def write(self, local, peer, remote_buffer, length=None, offset=0, remote_offset=0,
              timeout=60.0):
        """Writes [offset, offset + length) of `local` (a Buffer, a Registration or a buffer
        id) into [remote_offset, +length) of the buffer named `remote_buffer` on `peer` (a
        node, this one's own included), and returns once it landed. `length` None: the rest
        of `local` after offset. Raises the transfer's error (OutOfRange naming the range,
        NotFound naming the buffer, ...). Returns the TransferResult."""
        return self.run([Op("write", local, offset, peer, remote_buffer, remote_offset, length)],
                        timeout=timeout)

    def read(self, local, peer, remote_buffer, length=None, offset=0, remote_offset=0,
             timeout=60.0):
        """Reads [remote_offset, +length) of the buffer named `remote_buffer` on `peer` into
        [offset, offset + length) of `local`, as write() does the other way."""
        return self.run([Op("read", local, offset, peer, remote_buffer, remote_offset, length)],
                        timeout=timeout)

    def run(self, ops, timeout=60.0, include_ops=False, check=True):
        """Runs a batch of Ops (or 7-tuples in Op's order) as one transfer, in one round
        trip. The agent validates the whole batch before anything moves: a refusal raises,
        naming the op and field (`ops[3].remote_offset: ...`). Returns a TransferResult
        (`ops`: every op's OpResult with include_ops=True); with `check` (the default) a
        transfer that failed raises its first failing op's error instead."""
        ops = list(ops)
        for i, op in enumerate(ops):
            if len(op) == 7 and isinstance(op[1], (Registration, Buffer, _ferry.Buffer)):
                self._check_mine(op[1], f"ops[{i}].local")
        raw = [self._op(i, op) for i, op in enumerate(ops)]
        r = self._s.run(raw, float(timeout), bool(include_ops))
        result = TransferResult(
            r["transfer_id"], r["state"], r["code"], r["message"], r["bytes"], r["bytes_total"],
            r["duration_us"], r["ops_total"], r["ops_failed"], r["policy_generation"],
            [OpResult(o["index"], o["code"], o["message"], o["bytes"], o["provider"],
                      o["duration_us"], o["legs"]) for o in r["ops"]])
        if check and result.state != "SUCCEEDED":
            if result.state == "RUNNING":
                raise DeadlineExceeded(f"transfer {result.transfer_id} still running")
            raise from_status(result.code or Unknown.code, result.message)
        return result

    @staticmethod
    def _op(i, op):
        """Session.run's tuple for op `i`: offsets into a Registration become offsets into
        its buffer, and a missing length is the rest of the local memory."""
        if len(op) != 7:
            raise InvalidArgument(f"ops[{i}]: {len(op)} fields, not Op's 7 "
                                  f"({', '.join(Op._fields)})")
        kind, local, local_offset, peer, remote_buffer, remote_offset, length = op
        if kind not in _OP_TYPES:
            raise InvalidArgument(f"ops[{i}].type: '{kind}' is not 'write' or 'read'")
        local_offset = int(local_offset)
        base, size = 0, None
        if isinstance(local, Registration):
            ident, base, size = local.id, local.offset, local.length
        elif isinstance(local, (Buffer, _ferry.Buffer)):
            ident, size = local.id, local.size
        else:
            ident = int(local)
        if length is None:
            if size is None:
                raise InvalidArgument(f"ops[{i}].length: needed when the local side is a "
                                      f"buffer id ({ident})")
            if local_offset > size:
                raise OutOfRange(f"ops[{i}].local_offset: {local_offset} is past the end of "
                                 f"buffer {ident} ({size} bytes)")
            length = size - local_offset
        length = int(length)
        if isinstance(local, Registration) and local_offset + length > size:
            raise OutOfRange(f"ops[{i}]: range [{local_offset}, {local_offset + length}) is "
                             f"outside the registration ({size} bytes)")
        return (_OP_TYPES[kind], ident, base + local_offset, str(peer), str(remote_buffer),
                int(remote_offset), length)

    def list_buffers(self):
        """The agent's buffers this client may see (its own, and named ones), as
        BufferInfos: `ferryctl buffers` as data."""
        return [BufferInfo(b["id"], b["name"], b["size"], b["device"], b["backend"], b["owner"],
                           b["persist"], b["registered"], tuple(b["allowed_peers"]))
                for b in self._s.list_buffers()]

    def policy(self):
        """The GDR / staging policy in force (PolicyState; `overrides`: the run-time
        settings over the config file's)."""
        return self._policy(self._s.get_policy())

    def set_policy(self, settings=None, clear=False, **kwargs):
        """Changes the policy at run time: set_policy(gdr="never", gdr_max_path="PXB") (or a
        dict). `clear`: drop the earlier run-time settings first; with no settings, back to
        the config file's policy. An invalid setting raises InvalidArgument and the old
        policy stays. Returns the new PolicyState."""
        pairs = dict(settings or {}, **kwargs)
        return self._policy(self._s.set_policy([(str(k), str(v)) for k, v in pairs.items()],
                                               bool(clear)))

    @staticmethod
    def _policy(p):
        return PolicyState(p["generation"], p["gdr"], p["gdr_max_path"], p["fallback"],
                           p["staging_chunk_bytes"], p["staging_depth"], dict(p["overrides"]))

    # --- memory you allocated, block lists ---------------------------------------------------

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
        entries = list(entries)
        for i, e in enumerate(entries):
            if not isinstance(e, (tuple, list)) or len(e) != 3:
                raise InvalidArgument(f"entries[{i}]: must be (registration_or_tensor, offset, "
                                      f"length)")

        def extents(regs, which):
            if not entries:
                raise InvalidArgument("entries: no blocks")
            rows = []
            for i, (_, offset, length) in enumerate(entries):
                g = regs[which[i]]
                offset, length = int(offset), int(length)
                _check_range(f"entries[{i}]", g, offset, length, 1, length)
                rows.append((g.id, g.offset + offset, length, 1, 0))
            return rows

        return self._prepare([e[0] for e in entries], extents, name)

    def prepare_strided(self, runs, name=None):
        """A block list of strided runs: `runs` is a sequence of (registration_or_tensor, base,
        stride, count, length), each `count` blocks of `length` bytes at base + k * stride
        of its memory (stride >= length: a run's blocks never overlap), numbered run by run.
        E.g. the head slice [h0, h1) of every block of a (blocks, heads, tokens, dim) KV
        cache: base h0 * head_bytes, stride block_bytes, length (h1 - h0) * head_bytes.
        Tensors are registered here as by prepare_entries. Returns a BlockList."""
        runs = list(runs)
        for i, run in enumerate(runs):
            if not isinstance(run, (tuple, list)) or len(run) != 5:
                raise InvalidArgument(f"runs[{i}]: must be (registration_or_tensor, base, stride, "
                                      f"count, length)")

        def extents(regs, which):
            if not runs:
                raise InvalidArgument("runs: no blocks")
            rows = []
            for i, (_, base, stride, count, length) in enumerate(runs):
                g = regs[which[i]]
                base, stride, count, length = int(base), int(stride), int(count), int(length)
                if count <= 0:
                    raise InvalidArgument(f"runs[{i}].count: must be positive")
                if count > 1 and stride < length:
                    raise InvalidArgument(f"runs[{i}].stride: {stride} is less than length "
                                          f"{length} (a run's blocks may not overlap)")
                _check_range(f"runs[{i}]", g, base, length, count, stride)
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

    def wait_notification(self, name, from_node="", timeout=60.0):
        """Takes notification `name` (waiting up to `timeout` seconds; 0 or less: a poll,
        answered at once: the notification, or DeadlineExceeded when it is not there; None:
        no limit). A batch that failed raises."""
        return self._wait(self._start_wait_notification(name, from_node, timeout))

    def _start_wait_notification(self, name, from_node="", timeout=60.0, _ended=()):
        call = self._s.wait_notification(name, from_node, _seconds(timeout), *_ended)
        return call, lambda n: Notification(**n), None

    @staticmethod
    def _wait(started):
        call, finish, _keep = started  # `_keep` lives in this frame until the call ended
        return finish(call.result())

    def poll_notifications(self, prefix="", max_count=0):
        """Takes every pending notification whose name starts with `prefix` (at most
        `max_count`; 0: all), oldest first, and returns them as a list at once: [] when none
        is there. Never waits: a connector's drain each engine step (one round trip over the
        agent's transfer socket where the client reaches it). Notifications of batches that
        failed come as they are (`code`, `message`), not raised."""
        out = []
        while True:
            want = max_count - len(out) if max_count else 0
            got, more = self._s.poll_notifications(prefix, want)
            out.extend(Notification(**n) for n in got)
            if not more or (max_count and len(out) >= max_count):
                return out

    def notifications(self, prefix="", timeout=None, max_count=0):
        """Yields notifications whose name starts with `prefix` until `timeout` seconds
        (None: until the generator is closed; 0 or less: those pending now, then it ends, as
        poll_notifications) or `max_count` of them."""
        if timeout is not None and timeout <= 0:
            yield from self.poll_notifications(prefix, max_count)
            return
        stream = self._s.open_notifications(prefix, float(timeout or 0), int(max_count))
        try:
            while True:
                n = stream.next()
                if n is None:
                    return
                yield Notification(**n)
        finally:
            stream.cancel()

    def cancel(self, peer, tag):
        """Cancels this agent's pending send to / receive from (peer, tag)."""
        return self._s.cancel(peer, tag)

    def pending(self):
        return self._s.pending()

    # --- futures ---------------------------------------------------------------------------

    def _async(self, start, *args, **kwargs):
        future = Future()
        key = self._completer.key()
        try:
            started = start(*args, _ended=(self._completer.queue, key), **kwargs)
        except Exception as e:  # noqa: B902 - bad input fails the future, as a failed call does
            future._fail(e)
            return future
        future._attach(started)
        self._completer.track(key, future)
        return future

    def send_async(self, tensor, peer, tag, **kwargs):
        return self._async(self._start_send, tensor, peer, tag, **kwargs)

    def recv_async(self, peer, tag, **kwargs):
        return self._async(self._start_recv, peer, tag, **kwargs)

    def write_blocks_async(self, buffer, peer, remote_buffer, blocks, **kwargs):
        return self._async(self._start_write_blocks, buffer, peer, remote_buffer, blocks,
                           **kwargs)

    def wait_notification_async(self, name, **kwargs):
        return self._async(self._start_wait_notification, name, **kwargs)


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


_default = None
_default_lock = threading.Lock()


def empty(shape, dtype="float32", device="host", like="numpy", name="", client=None):
    """An uninitialised tensor in agent memory on `device` ("host", or "cuda:N": GPU N's pool,
    simulated or CUDA), from `client` or a default Client() made on first use."""
    global _default
    if client is None:
        with _default_lock:
            if _default is None:
                _default = Client()
            client = _default
    return client.empty(shape, dtype, name=name, like=like, device=device)


def _received_view(r, like):
    """The tensor a receive returns: a zero-copy view of its landing buffer."""
    meta = r["meta"]
    if r["buffer"] is None:  # zero elements
        if like == "torch":
            torch = _torch()
            return torch.empty(meta["shape"],
                               dtype={v: k for k, v in _torch_dtypes().items()}[meta["dtype"]])
        return _np().empty(meta["shape"], dtype=_NUMPY_VIEW.get(meta["dtype"], meta["dtype"]))
    buf = Buffer(r["buffer"])
    view = buf.torch if like == "torch" else buf.numpy
    return view(meta["dtype"], meta["shape"], r["offset"], list(meta["strides"]) or None)
