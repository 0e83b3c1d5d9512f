"""The channel between the control process and its front processes (issue 28).

ZeroMQ with msgpack, as vLLM v1's API servers talk to their engine core: the control process
binds one ROUTER socket; each front connects a DEALER named ``front-<index>``. A message is a
msgpack array whose first item names it; what one side sends in a turn of its event loop goes
as one ZeroMQ frame (an array of messages), so the cost of a send is shared by everything that
happened meanwhile. Delivery is in order per front, so a front's progress for a request always
precedes its report of the request's end, and the control process's tokens for a request
precede its end.

Front → control:
  ``hello``             a front started (or restarted): send it the state at once
  ``open``              a request to decide on (its metadata and prompt ids)
  ``abort``             the client left, or a stop string ended the output
  ``progress``          tokens streamed from vLLM servers: [[rid, ids, times], ...], batched
  ``ended``             a stream from a vLLM server ended: rid, Ending.wire()
  ``metrics``           a /metrics page, please (a nonce to match the answer)
Control → front:
  ``opened``/``refused`` the decision on an ``open``: the SLO applied, or the HTTP error
  ``stream``/``cancel`` run (stop) a request's stream from a vLLM server: rid, url, body
  ``tokens``            tokens of in-process engines: [[rid, [ids]], ...], one batch per step
  ``end``               a request ended: reason, error and the record's times
  ``state``             readiness, every ``STATE_SECONDS`` (the fronts' heartbeat too)
  ``metrics``           the page asked for

A message that does not parse or does not fit is logged and dropped, never a crash.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgpack
import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

STATE_SECONDS = 0.5  # how often the control process tells the fronts its state
# A front that hears nothing this long takes the control process for hung. Its death is seen
# at once (the front's parent changes); silence alone is only a hang, and a control process
# starved of CPU (a vLLM engine on the same cores) can miss its 0.5 s heartbeats for seconds:
# declaring it dead then would end every stream for nothing.
CONTROL_SILENCE_SECONDS = 30.0


def pack(messages: list[list[Any]]) -> bytes:
    return msgpack.packb(messages, use_bin_type=True)


def unpack(data: bytes) -> list[list[Any] | None]:
    """The frame's messages; None (logged) for each that is not an array starting with its
    kind, and a single None for a frame that is not msgpack at all."""
    try:
        messages = msgpack.unpackb(data, raw=False)
    except Exception as e:  # msgpack raises several unrelated types on bad input
        log.warning("dropped a frame that is not msgpack: %s", e)
        return [None]
    if not isinstance(messages, list):
        log.warning("dropped a frame of unexpected shape: %.200r", messages)
        return [None]
    out: list[list[Any] | None] = []
    for m in messages:
        if isinstance(m, list) and m and isinstance(m[0], str):
            out.append(m)
        else:
            log.warning("dropped a message of unexpected shape: %.200r", m)
            out.append(None)
    return out


class _Outbox:
    """Messages to one peer, sent together at the end of the loop's turn."""

    __slots__ = ("messages", "scheduled")

    def __init__(self) -> None:
        self.messages: list[list[Any]] = []
        self.scheduled = False


def front_identity(index: int) -> bytes:
    return f"front-{index}".encode()


class ControlSocket:
    """The control process's end: one ROUTER, every front on it."""

    def __init__(self, address: str) -> None:
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted front takes its name back
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 0)  # never drop for a slow front: it is ours
        self.socket.bind(address)
        self._out: dict[bytes, _Outbox] = {}

    def send(self, front: bytes, message: list[Any]) -> None:
        box = self._out.get(front)
        if box is None:
            box = self._out[front] = _Outbox()
        box.messages.append(message)
        if not box.scheduled:
            box.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush, front, box)

    def _flush(self, front: bytes, box: _Outbox) -> None:
        messages, box.messages, box.scheduled = box.messages, [], False
        # Unawaited: a send that would not block completes at once; one to a front that is
        # gone is dropped by the ROUTER, which is what a dead front's messages deserve.
        self.socket.send_multipart((front, pack(messages)), copy=False)

    async def recv(self) -> tuple[bytes, list[list[Any] | None]]:
        frames = await self.socket.recv_multipart()
        if len(frames) != 2:
            log.warning("dropped a frame of %d parts", len(frames))
            return (frames[0] if frames else b""), [None]
        return frames[0], unpack(frames[1])

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()


class FrontSocket:
    """A front's end: one DEALER to the control process."""

    def __init__(self, address: str, index: int) -> None:
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.IDENTITY, front_identity(index))
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self._out = _Outbox()

    def send(self, message: list[Any]) -> None:
        self._out.messages.append(message)
        if not self._out.scheduled:
            self._out.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        messages, self._out.messages, self._out.scheduled = self._out.messages, [], False
        self.socket.send(pack(messages), copy=False)

    async def recv(self) -> list[list[Any] | None]:
        return unpack(await self.socket.recv())

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()
