"""ferry.Client, a connection to this node's agent: its buffers and the agent's state here,
its calls from the mixins (_tensor_calls, _transfer_calls, _block_calls, _notifications),
and ferry.empty over a default Client."""

import collections
import threading
import weakref

from . import _ferry
from . import session as _session
from ._block_calls import _BlockCalls
from ._calls import _Calls
from ._dtypes import DTYPES, _is_torch, _np, dtype_name
from ._notifications import _NotificationCalls
from ._tensor_calls import _TensorCalls
from ._transfer_calls import _TransferCalls
from .buffers import Buffer
from .errors import FailedPrecondition, InvalidArgument
from .futures import _Completer

BufferInfo = collections.namedtuple(
    "BufferInfo", "id name size device backend owner persist registered allowed_peers")
PolicyState = collections.namedtuple(
    "PolicyState", "generation gdr gdr_max_path fallback staging_chunk_bytes staging_depth "
    "overrides")


def default_socket():
    """The socket ferry.Client() connects to: $FERRY_SOCKET when set, else
    /tmp/ferryd-<host name>.sock. The same rule as ferryctl and libferry."""
    return _ferry.default_socket()


class Client(_TensorCalls, _TransferCalls, _BlockCalls, _NotificationCalls, _Calls):
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

    # --- the agent's buffers and policy -------------------------------------------------

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
