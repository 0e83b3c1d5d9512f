"""CPU per message of the control process ↔ front channel's candidates.

Two processes, each its own asyncio loop, as a front and its control process: the sender sends
one msgpack frame per turn of its loop (as ``hfx.serving.ipc`` flushes once per turn), the
receiver decodes each. CPU time of both processes (their threads included: ZeroMQ's I/O
threads) over the messages gives µs per message. Channels: ``unix`` (``hfx.serving.ipc``:
asyncio over a Unix-domain socket, length-prefixed frames) and ``zmq`` (pyzmq's asyncio DEALER →
ROUTER over ipc://, as vLLM v1's API server ↔ engine core; skipped when pyzmq is missing).

    python bench/serving/ipc_cost.py --messages 20000 --json docs/data/ipc_cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import tempfile
import time
from typing import Any

import msgpack

MESSAGE = [["progress", [["cmpl-1a2b-17", 0, [116, 116, 116, 116], [1.0, 1.0, 1.0, 1.0]]]]]


async def _unix_receiver(path: str, n: int, ready: Any, out: Any) -> None:
    from hfx.serving.ipc import ControlSocket

    done = asyncio.Event()
    got = 0

    def heard(front: bytes, messages: list[Any]) -> None:
        nonlocal got
        got += len(messages)
        if got >= n:
            done.set()

    control = ControlSocket(path, heard)
    await control.start()
    ready.set()
    t0 = time.process_time()
    await done.wait()
    out.put(("receiver", time.process_time() - t0))
    await control.close()


async def _unix_sender(path: str, n: int, out: Any) -> None:
    from hfx.serving.ipc import FrontSocket

    front = FrontSocket(path, 0, lambda messages: None, lambda: None)
    await front.connect()
    t0 = time.process_time()
    for _ in range(n):
        front.send(MESSAGE[0])
        await asyncio.sleep(0)  # one turn of the loop: one frame
    out.put(("sender", time.process_time() - t0))
    await asyncio.sleep(0.5)
    front.close()


async def _zmq_receiver(path: str, n: int, ready: Any, out: Any) -> None:
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"ipc://{path}")
    ready.set()
    got = 0
    t0 = time.process_time()
    while got < n:
        _, frame = await sock.recv_multipart()
        got += len(msgpack.unpackb(frame))
    out.put(("receiver", time.process_time() - t0))
    sock.close(0)
    ctx.term()


async def _zmq_sender(path: str, n: int, out: Any) -> None:
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"front-0")
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(f"ipc://{path}")
    await asyncio.sleep(0.2)
    t0 = time.process_time()
    for _ in range(n):
        sock.send(msgpack.packb(MESSAGE, use_bin_type=True), copy=False)
        await asyncio.sleep(0)
    out.put(("sender", time.process_time() - t0))
    await asyncio.sleep(0.5)
    sock.close(0)
    ctx.term()


def _receive(channel: str, path: str, n: int, ready: Any, out: Any) -> None:
    asyncio.run((_unix_receiver if channel == "unix" else _zmq_receiver)(path, n, ready, out))


def _send(channel: str, path: str, n: int, out: Any) -> None:
    asyncio.run((_unix_sender if channel == "unix" else _zmq_sender)(path, n, out))


def measure(channel: str, n: int) -> dict[str, Any]:
    """Each side reports its own process CPU time (all its threads) over the messages."""
    ctx = multiprocessing.get_context("spawn")
    path = os.path.join(tempfile.mkdtemp(prefix="hfx-ipc-bench-"), "control")
    ready, out = ctx.Event(), ctx.Queue()
    receiver = ctx.Process(target=_receive, args=(channel, path, n, ready, out))
    receiver.start()
    ready.wait(30)
    sender = ctx.Process(target=_send, args=(channel, path, n, out))
    sender.start()
    cpu = dict(out.get(timeout=300) for _ in range(2))
    sender.join()
    receiver.join()
    return {"channel": channel, "messages": n,
            "sender_cpu_us_per_message": round(cpu["sender"] / n * 1e6, 2),
            "receiver_cpu_us_per_message": round(cpu["receiver"] / n * 1e6, 2),
            "cpu_us_per_message": round((cpu["sender"] + cpu["receiver"]) / n * 1e6, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--channels", default="unix,zmq")
    p.add_argument("--json")
    args = p.parse_args()
    results = []
    for channel in args.channels.split(","):
        if channel == "zmq":
            try:
                import zmq  # noqa: F401
            except ImportError:
                print("zmq: pyzmq is not installed; skipped")
                continue
        r = measure(channel, args.messages)
        results.append(r)
        print(f"{channel:5s} {r['cpu_us_per_message']:7.2f} µs CPU per message "
              f"(sender {r['sender_cpu_us_per_message']}, receiver "
              f"{r['receiver_cpu_us_per_message']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python bench/serving/ipc_cost.py " + " ".join(
                f"--{k} {v}" for k, v in (("messages", args.messages),
                                          ("channels", args.channels))),
                       "note": "process CPU time (all threads) of sender and receiver over "
                               "the messages, each measured in its own process",
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
