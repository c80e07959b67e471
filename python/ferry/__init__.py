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

from . import _ferry
from . import launch
from ._dtypes import DTYPES, _torch, dtype_name
from ._notifications import MAX_NOTIFY_PAYLOAD, Notification
from ._transfer_calls import Op, OpResult, TransferResult
from .blocks import BlockList, Handle, Registration
from .buffers import Buffer
from .client import BufferInfo, Client, PolicyState, default_socket, empty
from .errors import (AgentRestarted, Aborted, AlreadyExists, Cancelled, DataLoss,
                     DeadlineExceeded, Error, FailedPrecondition, Internal, InvalidArgument,
                     NotFound, OutOfRange,
                     PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable,
                     Unimplemented, Unknown, from_status)
from .futures import Future

__version__ = _ferry.__version__

__all__ = ["Client", "Buffer", "Future", "Notification", "Registration", "BlockList", "Handle",
           "Op", "TransferResult", "OpResult", "BufferInfo", "PolicyState",
           "empty", "DTYPES", "Error", "Cancelled", "Unknown",
           "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
           "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
           "OutOfRange", "Unimplemented", "Internal", "Unavailable", "AgentRestarted", "DataLoss",
           "Unauthenticated", "launch", "default_socket", "__version__"]

# Reachable as ferry.<name> as before the package was split, though not in __all__ (so not
# by `import *`): ferry.vllm calls ferry._torch(), tests read ferry.MAX_NOTIFY_PAYLOAD.
_ALSO_EXPORTED = (_torch, dtype_name, from_status, MAX_NOTIFY_PAYLOAD)
