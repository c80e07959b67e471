"""Agent buffers mapped into this process, and the tensors that are views of them."""

from . import _ferry
from ._dtypes import _NUMPY_VIEW, _np, _torch, _torch_dtypes, dtype_name
from .errors import OutOfRange


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
