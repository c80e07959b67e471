#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora under tests/fuzz/corpus/<target>/: small valid inputs and
edge cases, by hand, with no dependency beyond Python (protobuf wire format encoded here).
Run it again after changing a harness's input format: python3 tests/fuzz/make_corpus.py"""

import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, value):
    """One protobuf field: int -> varint, bytes/str -> length-delimited, list -> repeated."""
    if isinstance(value, list):
        return b"".join(field(num, v) for v in value)
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint((num << 3) | 2) + varint(len(value)) + value


def message(*fields):
    return b"".join(field(n, v) for n, v in fields)


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# tcp_frames: transport/tcp/wire.h. Keys are the harness's placeholders KEY1 (read-write at
# 0x10000000) and KEY2 (read-only at 0x20000000), 4 KiB each.
REQ, WRITE, WRITE_IMM, READ, HELLO, WRITE_LIST = 0x46524551, 1, 2, 3, 4, 5
VERSION = 4
KEY1, KEY2 = 0x3159454B, 0x3259454B
RW, RO = 0x10000000, 0x20000000


def req(op, id=0, address=0, length=0, key=0, imm=0, magic=REQ):
    return struct.pack("<IIQQQII", magic, op, id, address, length, key, imm)


# The first header's id "SESSION!" is the harness's placeholder: it puts the session and
# secret of a ticket it issued there (address and length hold the secret on the wire).
SESSION = 0x214E4F4953534553
hello = req(HELLO, id=SESSION, imm=VERSION)


def pieces(*table):
    return b"".join(struct.pack("<QQ", offset, length) for offset, length in table)


tcp = {
    "hello": hello,
    "write": hello + req(WRITE, 1, RW, 16, KEY1) + bytes(range(16)),
    "write_read": hello + req(WRITE, 1, RW + 100, 8, KEY1) + b"ABCDEFGH" +
                  req(READ, 2, RW + 96, 16, KEY1),
    "write_imm": hello + req(WRITE_IMM, 3, RW, 4, KEY1, imm=77) + b"wxyz",
    "read_only": hello + req(READ, 4, RO, 64, KEY2) + req(WRITE, 5, RO, 4, KEY2) + b"nope",
    "out_of_bounds": hello + req(READ, 6, RW + 4000, 200, KEY1) +
                     req(READ, 7, RW + 8, (1 << 64) - 1, KEY1) + req(READ, 8, RW - 1, 1, KEY1),
    "bad_key": hello + req(WRITE, 9, RW, 4, 12345) + b"drop" + req(READ, 10, RW, 4, 0),
    "bad_op": hello + req(9, 11, RW, 4, KEY1),
    "no_hello": req(WRITE, 1, RW, 4, KEY1) + b"evil",
    "old_version": req(HELLO, id=SESSION, imm=VERSION - 1) + req(READ, 1, RW, 4, KEY1),
    "unknown_session": req(HELLO, id=12345, address=1, imm=VERSION) + req(READ, 1, RW, 4, KEY1),
    "write_list": hello + req(WRITE_LIST, 1, RW, 12, KEY1, imm=3) +
                  pieces((4000, 4), (0, 4), (2048, 4)) + b"tailheadmidd" +
                  req(READ, 2, RW + 2048, 8, KEY1),
    "write_list_bad_count": hello + req(WRITE_LIST, 1, RW, 4, KEY1, imm=0) +
                            req(WRITE_LIST, 2, RW, 4, KEY1, imm=5000),
    "write_list_framing": hello + req(WRITE_LIST, 1, RW, 8, KEY1, imm=2) +
                          pieces((0, 4), (8, 0)) + b"abcdefgh",
    "write_list_overflow": hello + req(WRITE_LIST, 1, RW, 8, KEY1, imm=2) +
                           pieces(((1 << 64) - 4, 4), (0, 4)) + b"abcdefgh",
    "write_list_refused": hello + req(WRITE_LIST, 1, RW, 8, KEY1, imm=2) +
                          pieces((0, 4), (4094, 4)) + b"abcdefgh" +
                          req(WRITE_LIST, 2, RO, 4, KEY2, imm=1) + pieces((0, 4)) + b"nope",
    "write_list_truncated": hello + req(WRITE_LIST, 1, RW, 400, KEY1, imm=2) +
                            pieces((0, 200), (1000, 200)) + b"short",
    "bad_magic": hello + req(READ, 1, RW, 4, KEY1) + req(READ, 2, RW, 4, KEY1, magic=0),
    "truncated_payload": hello + req(WRITE, 1, RW, 100, KEY1) + b"short",
    "zero_length": hello + req(WRITE, 1, RW + 4096, 0, KEY1) + req(READ, 2, RW + 4096, 0, KEY1),
    "half_header": hello + req(READ, 1, RW, 4, KEY1)[:20],
}
for name, data in tcp.items():
    write("tcp_frames", name, data)

# config: ParseConfig's YAML, every section; lines "key=value" for ApplyPolicySetting.
configs = {
    "empty": "",
    "minimal": "node: a\n",
    "peers": "node: a\nlisten:\n  peer: 127.0.0.1:0\npeers:\n  b: 127.0.0.1:7101\n  c: '[::1]:7102'\n",
    "policy": "policy:\n  gdr: always\n  gdr_max_path: PHB\n  fallback: staged\n"
              "  staging_chunk: 4MiB\n  staging_depth: 4\n",
    "limits": "limits:\n  max_op_bytes: 1GiB\n  max_ops_per_submit: 0\n  default_timeout_ms: -1\n",
    "wrong_types": "node: [1, 2]\npeers: 7\nhost_pool: {size: -1}\n",
    "anchors": "a: &x {node: b}\nb: *x\nnode: *x\n",
    "settings": "gdr=never\nstaging_chunk=4096\nstaging_depth=256\nfallback=fail\n"
                "staging_depth=0\nstaging_chunk=18446744073709551615\n",
    "tabs": "node:\ta\n\t- b\n",
}
for name, text in configs.items():
    write("config", name, text.encode())
shutil.copy(os.path.join(ROOT, "config", "ferry.example.yaml"),
            os.path.join(HERE, "corpus", "config", "example.yaml"))

# handshake: first byte 0 = ConnectRequest, 1 = reply to a verbs initiator, 2 = QP address.


def qp_address(qpn=0x1234, psn=0x42, lid=0x22, fabric_id=7, retired=(), link_layer=1, mtu=5,
               flags=1, magic=b"FVQP", version=1):
    out = magic + bytes([version, link_layer, mtu, flags])
    out += struct.pack("<IIH", qpn, psn, lid) + bytes(16) + struct.pack("<QH", fabric_id,
                                                                        len(retired))
    return out + b"".join(struct.pack("<I", q) for q in retired)


valid = qp_address()
hs = {
    "connect_verbs": b"\0" + message((1, "node-b"), (2, "verbs"), (3, valid), (4, 9)),
    "connect_retired": b"\0" + message((1, "node-b"), (2, "verbs"),
                                       (3, qp_address(retired=[0x1234, 5, 0xFFFFFF])), (4, 9)),
    "connect_tcp": b"\0" + message((1, "node-b"), (2, "tcp"), (4, 1)),
    "connect_garbage": b"\0" + message((2, "verbs"), (3, b"FVQP\1\1")),
    "reply": b"\1" + qp_address(flags=0),
    "reply_roce": b"\1" + qp_address(link_layer=2),
    "reply_bad_count": b"\1" + valid[:-2] + struct.pack("<H", 3),
    "reply_qpn_0": b"\1" + qp_address(qpn=0),
    "address": b"\2" + valid,
    "address_short": b"\2" + valid[:40],
    "address_bad_mtu": b"\2" + qp_address(mtu=9),
    "address_version": b"\2" + qp_address(version=2),
}
for name, data in hs.items():
    write("handshake", name, data)


# requests: first byte 0 = SubmitRequest, 1 = WriteBlocksRequest, 2 = SendRequest,
# 3 = RecvRequest. Local buffer 1 (64 KiB), peer node-b, its buffer "landing" (1 MiB).
def op(type_, length, local_offset=0, remote_offset=0, peer="node-b", remote="landing",
       local=1):
    return message((1, type_), (2, local), (3, local_offset), (4, peer), (5, remote),
                   (6, remote_offset), (7, length))


def target_op(type_, length, target, local_offset=0, remote_offset=0, local=1):
    """An op naming its remote buffer by index into SubmitRequest.targets (Op.target)."""
    return message((1, type_), (2, local), (3, local_offset), (6, remote_offset), (7, length),
                   (8, target))


def target(peer="node-b", remote="landing"):
    return message((1, peer), (2, remote))


def meta(dtype=1, shape=(), strides=(), device="", tag="t"):
    return message((1, dtype), (2, list(shape)), (3, list(strides)), (4, device), (5, tag))


rq = {
    "submit_write": b"\0" + message((1, op(1, 4096)), (2, 1000)),
    "submit_read": b"\0" + message((1, op(2, 65536, remote_offset=4096))),
    "submit_batch": b"\0" + message((1, [op(1, 100, i * 100, i * 1000) for i in range(8)])),
    "submit_out_of_range": b"\0" + message((1, op(1, 16, local_offset=(1 << 64) - 8))),
    "submit_remote_range": b"\0" + message((1, op(2, 2, remote_offset=(1 << 20) - 1))),
    "submit_unknown_peer": b"\0" + message((1, op(1, 8, peer="node-z"))),
    "submit_unknown_buffer": b"\0" + message((1, op(1, 8, remote="nothing"))),
    "submit_empty": b"\0",
    "submit_timeout": b"\0" + message((1, op(1, 8)), (2, 0xFFFFFFFF)),
    "submit_targets": b"\0" + message((1, [target_op(1, 100, i % 2, i * 100, i * 1000)
                                           for i in range(8)]),
                                      (3, [target(), target("node-z")])),
    "submit_target_past": b"\0" + message((1, target_op(1, 8, 5)), (3, target())),
    "submit_target_and_name": b"\0" + message((1, op(1, 8) + varint(8 << 3) + varint(0)),
                                              (3, target())),
    "blocks": b"\1" + message((1, 1), (2, "node-b"), (3, "landing"),
                              (4, [message((1, 0), (2, 8192), (3, 4096)),
                                   message((1, 4096), (2, 0), (3, 4096))]), (6, 1000)),
    "blocks_notify": b"\1" + message((1, 1), (2, "node-b"), (3, "landing"),
                                     (4, message((3, 16))), (5, "kv-0"), (6, 500)),
    "blocks_empty": b"\1" + message((1, 1), (2, "node-b"), (3, "landing")),
    "send": b"\2" + message((1, 1), (3, meta(shape=(4, 1024))), (4, "node-b")),
    "send_strided": b"\2" + message((3, meta(dtype=7, shape=(3, 5), strides=(10, 1),
                                             device="cuda:0"))),
    "send_huge": b"\2" + message((3, meta(shape=(1 << 62, 4), strides=((1 << 63) - 1, 1)))),
    "recv": b"\3" + message((1, "node-b"), (2, "t"), (5, meta(dtype=3, shape=(0, 7)))),
    "recv_negative": b"\3" + message((5, meta(shape=(-1,), strides=(-4,)))),
}
for name, data in rq.items():
    write("requests", name, data)
