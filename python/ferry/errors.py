"""ferry's exceptions: every failed call raises an Error carrying the gRPC status.

    try:
        client.recv("node-a", "grad/0", timeout=1.0)
    except ferry.DeadlineExceeded as e:
        print(e.code, e.code_name, e.message)   # 4 DEADLINE_EXCEEDED "receive of ..."
"""

# google.rpc.Code, as gRPC and absl::Status number them.
CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class Error(Exception):
    """A call failed. `code` is the gRPC status code (int), `code_name` its name."""

    code = 2

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    @property
    def code_name(self):
        return CODE_NAMES.get(self.code, str(self.code))

    def __str__(self):
        return f"{self.code_name}: {self.message}"


class Cancelled(Error):
    code = 1


class Unknown(Error):
    code = 2


class InvalidArgument(Error, ValueError):
    code = 3


class DeadlineExceeded(Error, TimeoutError):
    code = 4


class NotFound(Error):
    code = 5


class AlreadyExists(Error):
    code = 6


class PermissionDenied(Error, PermissionError):
    """The agent refused the caller (its uid), e.g. an operator call without root or the
    admin group, or another uid's transfer."""
    code = 7


class ResourceExhausted(Error):
    code = 8


class FailedPrecondition(Error):
    code = 9


class Aborted(Error):
    code = 10


class OutOfRange(Error):
    code = 11


class Unimplemented(Error, NotImplementedError):
    code = 12


class Internal(Error):
    code = 13


class Unavailable(Error):
    code = 14


class AgentRestarted(Unavailable):
    """The client's agent restarted (or died and came back) since its last call: everything
    the old session held is gone there. Raised once, by the first call after it; the Client
    has reconnected on a new session by then, so the next calls work. `lost`: what the old
    session held, {"registrations": [name or id], "lists": [name or id], "buffers": [id]};
    register and prepare again what you still need (the old Registration, BlockList, Buffer
    and Handle objects refuse further use)."""

    def __init__(self, message, code=None, lost=None):
        super().__init__(message, code)
        self.lost = lost or {"registrations": [], "lists": [], "buffers": []}


class DataLoss(Error):
    """Bytes that arrived differ from what was sent (a verify=True check failed)."""
    code = 15


class Unauthenticated(Error):
    code = 16


# One class for every code but OK (tests/python/test_errors.py checks that none is missing).
ERRORS = (Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
          PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
          Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
_BY_CODE = {cls.code: cls for cls in ERRORS}


def from_status(code, message):
    """The exception for a status (used by the compiled module)."""
    return _BY_CODE.get(code, Error)(message, code)
