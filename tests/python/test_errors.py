"""Every gRPC status code has its ferry exception class (python/ferry/errors.py)."""
import pytest

import ferry
from ferry import errors

# grpc/impl/codegen/status_code_enum.h (and google/rpc/code.proto): every code but OK.
GRPC_CODES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


def class_name(code_name):
    return "".join(part.capitalize() for part in code_name.split("_"))


@pytest.mark.parametrize("code,name", sorted(GRPC_CODES.items()))
def test_every_code_has_its_class(code, name):
    err = errors.from_status(code, "what went wrong")
    cls = getattr(ferry, class_name(name))       # exported by the package, named after the code
    assert type(err) is cls
    assert isinstance(err, ferry.Error)
    assert (err.code, err.code_name, err.message) == (code, name, "what went wrong")
    assert str(err) == f"{name}: what went wrong"
    with pytest.raises(cls):
        raise err


def test_no_two_codes_share_a_class():
    assert len({type(errors.from_status(c, "")) for c in GRPC_CODES}) == len(GRPC_CODES)


def test_python_exception_bases():
    assert isinstance(errors.from_status(3, ""), ValueError)
    assert isinstance(errors.from_status(4, ""), TimeoutError)
    assert isinstance(errors.from_status(7, ""), PermissionError)
    assert isinstance(errors.from_status(12, ""), NotImplementedError)


def test_a_code_from_a_newer_agent_is_still_an_error():
    err = errors.from_status(99, "new")
    assert type(err) is ferry.Error and err.code == 99 and err.code_name == "99"
