"""Element types: ferry's dtype names, and numpy / torch dtypes mapped to them.

numpy and torch are imported on first use (_np, _torch): `import ferry` needs neither."""

from . import _ferry
from .errors import InvalidArgument

DTYPES = ("float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64",
          "float8_e4m3fn", "float8_e5m2", "float64", "int16", "bool")

# numpy has no bfloat16 / float8: their bytes are viewed as unsigned integers of the same size.
_NUMPY_VIEW = {"bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


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
