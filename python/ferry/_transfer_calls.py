"""Client calls that move ranges of named buffers: write, read and batches of them (run)."""

import collections

from . import _ferry
from .blocks import Registration
from .buffers import Buffer
from .errors import DeadlineExceeded, InvalidArgument, OutOfRange, Unknown, from_status

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
_OP_TYPES = {"write": 1, "read": 2}


class _TransferCalls:
    """Client's one-sided transfers: ranges of named buffers, batches."""

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
