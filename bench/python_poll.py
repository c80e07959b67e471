#!/usr/bin/env python3
"""What draining notifications costs a connector in Python, per call (issue 46).

Two agents on this machine (tcp over loopback). Decode ("d") pulls blocks from prefill's
("p") exported list with a notification; prefill drains them with Client.poll_notifications.
Timed, each as microseconds per call (median of REPS rounds):
  - an empty poll over the transfer socket (the default where the client reaches it),
  - the same over gRPC (Tensors.PollNotifications; FERRY_TRANSFER_SOCKET=0),
  - the stand-in a connector had before: notifications(prefix, timeout=0.001), a stream per call,
  - a poll that takes 100 pending notifications (each with a 64-byte payload), per poll and
    per notification.

Run: PYTHONPATH=<build>/python FERRYD=<build>/server/ferryd python3 bench/python_poll.py
"""
import os
import statistics
import time

import torch

import ferry

EMPTY_CALLS = 10000
STREAM_CALLS = 200
PENDING = 100
FULL_POLLS = 20
REPS = 5
BLOCK = 4096


def per_call_us(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def median_us(fn, calls):
    fn()  # connections made, caches warm
    return statistics.median(per_call_us(fn, calls) for _ in range(REPS))


def grpc_only_client(socket):
    """A Client that never uses the transfer socket (libferry reads the variable at connect)."""
    os.environ["FERRY_TRANSFER_SOCKET"] = "0"
    try:
        return ferry.Client(socket)
    finally:
        del os.environ["FERRY_TRANSFER_SOCKET"]


def main():
    with ferry.launch.agents(["prefill", "decode"], host_pool="64MiB") as nodes:
        p = ferry.Client(nodes["prefill"].socket)
        d = ferry.Client(nodes["decode"].socket)
        over_grpc = grpc_only_client(nodes["prefill"].socket)

        socket_us = median_us(lambda: p.poll_notifications("req-"), EMPTY_CALLS)
        grpc_us = median_us(lambda: over_grpc.poll_notifications("req-"), EMPTY_CALLS)
        stream_us = median_us(lambda: list(p.notifications("req-", timeout=0.001)),
                              STREAM_CALLS)

        src = torch.zeros(PENDING * BLOCK, dtype=torch.uint8).share_memory_()
        dst = torch.zeros(PENDING * BLOCK, dtype=torch.uint8).share_memory_()
        kv = p.prepare_blocks([src], BLOCK, name="kv")
        mine = d.prepare_blocks([dst], BLOCK)
        payload = bytes(range(64))
        full = []
        for _ in range(FULL_POLLS):
            for i in range(PENDING):
                d.read_blocks("prefill", "kv", [i], mine, [i], notify=f"req-{i}",
                              notify_payload=payload, wait=True)
            d.read_blocks("prefill", "kv", [0], mine, [0], notify="settled", wait=True)
            p.wait_notification("settled", timeout=10)  # the 100 before it arrived
            start = time.perf_counter()
            got = p.poll_notifications("req-")
            full.append((time.perf_counter() - start) * 1e6)
            assert len(got) == PENDING and got[0].payload == payload, len(got)
        full_us = statistics.median(full)
        mine.release()
        kv.release()

    print(f"empty poll, transfer socket   {socket_us:8.1f} us/call  (median of {REPS} x "
          f"{EMPTY_CALLS})")
    print(f"empty poll, gRPC unary        {grpc_us:8.1f} us/call")
    print(f"notifications(timeout=0.001)  {stream_us:8.1f} us/call  (a stream per call; the "
          f"stand-in before)")
    print(f"poll taking {PENDING} pending        {full_us:8.1f} us/poll, "
          f"{full_us / PENDING:.2f} us/notification (64-byte payloads; median of {FULL_POLLS})")


if __name__ == "__main__":
    main()
