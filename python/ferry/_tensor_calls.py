"""Client calls that send and receive tensors by tag (send, recv and their _async forms)."""

import itertools
import os as _os

from . import _ferry
from . import session as _session
from ._calls import _same, _seconds
from ._dtypes import _NUMPY_VIEW, _is_torch, _np, dtype_name
from .buffers import _received_view
from .errors import FailedPrecondition

# Names of the registrations that CUDA tensors outside agent memory land in (recv's out=).
_landings = itertools.count(1)


class _TensorCalls:
    """Client's tensor calls: a tensor in agent memory goes without a copy, host memory
    outside it through a temporary buffer, a CUDA tensor registered for the call."""

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

    def cancel(self, peer, tag):
        """Cancels this agent's pending send to / receive from (peer, tag)."""
        return self._s.cancel(peer, tag)

    def pending(self):
        return self._s.pending()

    def send_async(self, tensor, peer, tag, **kwargs):
        return self._async(self._start_send, tensor, peer, tag, **kwargs)

    def recv_async(self, peer, tag, **kwargs):
        return self._async(self._start_recv, peer, tag, **kwargs)
