"""The channel between the control process and its front processes.

A Unix-domain stream socket per front, driven by each side's own event loop, carrying frames of
msgpack (a 4-byte length, then the payload). The control process listens; each front connects
and names itself in its connection's first frame (``front-<index>``); a restarted front's new
connection takes the name over. A frame is a msgpack array of messages, each an array whose
first item names it: what one side sends in a turn of its event loop goes as one frame, so the
cost of a write is shared by everything that happened meanwhile. Delivery is in order per
front, so a front's progress for a request always precedes its report of the request's end,
and the control process's tokens for a request precede its end.

Not ZeroMQ (which vLLM v1 uses between its API servers and engine core, and which this channel
used first): measured on this project's 2-core VM, one frame per turn of the loop between two
asyncio processes cost ~20 µs of CPU over ZeroMQ (its I/O threads wake on both sides) and ~11
µs over a Unix socket, sender and receiver together (``bench/serving/ipc_cost.py``); in the relay
benchmark the change took the control process from 6.8 to 4.8 µs per relayed token at 32
streams (docs/performance.md, "Relay speed").

Front → control:
  ``hello``             a front started (or restarted): send it the state at once
  ``open``              a request to decide on (its metadata and prompt ids)
  ``abort``             the client left, or a stop string ended the output
  ``progress``          tokens streamed from vLLM servers: [[rid, ids, times], ...], batched
  ``ended``             a stream from a vLLM server ended: rid, Ending.wire()
  ``metrics``           a /metrics page, please (a nonce to match the answer)
  ``alive``             every 0.5 s: its loop runs (a front silent past ``--front-timeout``
                        is killed and replaced)
Control → front:
  ``opened``/``refused`` the decision on an ``open``: the SLO applied, or the HTTP error
  ``stream``/``cancel`` run (stop) a request's stream from a vLLM server: rid, url, body
  ``tokens``            tokens of in-process engines: [[rid, [ids]], ...], one batch per step
  ``end``               a request ended: reason, error and the record's times
  ``state``             readiness, every ``STATE_SECONDS`` (the fronts' heartbeat too)
  ``metrics``           the page asked for

A message that does not parse or does not fit is logged and dropped, never a crash; a frame
longer than ``MAX_FRAME_BYTES`` cannot be skipped safely, so its connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import msgpack

log = logging.getLogger(__name__)

STATE_SECONDS = 0.5  # how often the control process tells the fronts its state
# A front that hears nothing this long takes the control process for hung. Its death is seen
# at once (the channel closes, and the front's parent changes); silence alone is only a hang,
# and a control process starved of CPU (a vLLM engine on the same cores) can miss its 0.5 s
# heartbeats for seconds: declaring it dead then would end every stream for nothing.
CONTROL_SILENCE_SECONDS = 30.0
# The largest frame: an ``open`` carries the prompt's ids (a 10 MB prompt is a few MB of
# msgpack); beyond this a length prefix is garbage, and the stream cannot be resynchronised.
MAX_FRAME_BYTES = 256 << 20
# A peer that stops reading: past this many bytes waiting to be written to it, its connection
# is closed (the control process then treats its front as dead; a front, its control process).
MAX_BUFFERED_BYTES = 256 << 20
_LENGTH = struct.Struct("!I")

Messages = list[list[Any] | None]


def pack(messages: list[list[Any]]) -> bytes:
    """One frame of ``messages``; one that cannot be encoded is logged and left out, not the
    others sent with it."""
    try:
        payload = msgpack.packb(messages, use_bin_type=True)
    except Exception:  # msgpack raises several unrelated types on what it cannot encode
        kept = []
        for m in messages:
            try:
                msgpack.packb(m, use_bin_type=True)
            except Exception as e:
                log.error("dropped a %r message that cannot be encoded: %s",
                          m[0] if m else None, e)
            else:
                kept.append(m)
        payload = msgpack.packb(kept, use_bin_type=True)
    return _LENGTH.pack(len(payload)) + payload


def unpack(data: bytes) -> Messages:
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
    out: Messages = []
    for m in messages:
        if isinstance(m, list) and m and isinstance(m[0], str):
            out.append(m)
        else:
            log.warning("dropped a message of unexpected shape: %.200r", m)
            out.append(None)
    return out


def front_identity(index: int) -> bytes:
    return f"front-{index}".encode()


class _Frames(asyncio.Protocol):
    """One connection's frames, split from its bytes as they come; the first is the peer's
    name (when ``named``)."""

    def __init__(self, on_frame: Callable[[_Frames, bytes], None],
                 on_lost: Callable[[_Frames], None]) -> None:
        self.on_frame, self.on_lost = on_frame, on_lost
        self.transport: asyncio.Transport | None = None
        self.name: bytes | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at, size = 0, len(buffer)
        while size - at >= 4:
            (length,) = _LENGTH.unpack_from(buffer, at)
            if length > MAX_FRAME_BYTES:
                log.error("a frame of %d bytes on the channel: closing the connection", length)
                buffer.clear()
                assert self.transport is not None
                self.transport.close()
                return
            end = at + 4 + length
            if end > size:
                break
            frame = bytes(buffer[at + 4:end])
            at = end
            self.on_frame(self, frame)
        del buffer[:at]

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost(self)

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(data)
        if transport.get_write_buffer_size() > MAX_BUFFERED_BYTES:
            log.error("the peer %r stopped reading (%d bytes unsent): closing the channel",
                      self.name, transport.get_write_buffer_size())
            transport.abort()


class _Outbox:
    """Messages to one peer, sent together at the end of the loop's turn."""

    __slots__ = ("messages", "scheduled")

    def __init__(self) -> None:
        self.messages: list[list[Any]] = []
        self.scheduled = False


class ControlSocket:
    """The control process's end: it listens at ``path``; every front connects to it.
    ``on_messages(front, messages)`` hears each frame."""

    def __init__(self, path: str, on_messages: Callable[[bytes, Messages], None],
                 on_lost: Callable[[bytes], None] = lambda front: None) -> None:
        self.path = path
        self.on_messages = on_messages
        self.on_lost = on_lost  # a front's connection closed (not one a restart replaced)
        # Bound and listening now, before any front is started: a front connects at once.
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(256)
        self._listener.setblocking(False)
        self._server: asyncio.AbstractServer | None = None
        self._peers: dict[bytes, _Frames] = {}
        self._out: dict[bytes, _Outbox] = {}
        self._closing = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _Frames(self._frame, self._lost), sock=self._listener)

    def _frame(self, peer: _Frames, frame: bytes) -> None:
        if peer.name is None:  # the connection's first frame: who it is
            peer.name = frame
            old = self._peers.get(frame)
            self._peers[frame] = peer  # a restarted front takes its name back
            if old is not None and old.transport is not None:
                old.transport.close()
            return
        self.on_messages(peer.name, unpack(frame))

    def _lost(self, peer: _Frames) -> None:
        if peer.name is not None and self._peers.get(peer.name) is peer:
            del self._peers[peer.name]
            if not self._closing:
                self.on_lost(peer.name)

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
        peer = self._peers.get(front)
        if peer is not None:  # else a front that is gone: what it was sent is dropped
            peer.write(pack(messages))

    async def close(self) -> None:
        self._closing = True
        for peer in list(self._peers.values()):
            if peer.transport is not None:
                peer.transport.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        else:
            self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class FrontSocket:
    """A front's end: one connection to the control process. ``on_messages`` hears each
    frame; ``on_lost`` is told once if the control process closes the channel."""

    def __init__(self, path: str, index: int, on_messages: Callable[[Messages], None],
                 on_lost: Callable[[], None]) -> None:
        self.path, self.index = path, index
        self.on_messages, self.on_lost = on_messages, on_lost
        self._peer: _Frames | None = None
        self._out = _Outbox()
        self._closing = False

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        _, peer = await loop.create_unix_connection(
            lambda: _Frames(self._frame, self._lost), self.path)
        name = front_identity(self.index)
        peer.write(_LENGTH.pack(len(name)) + name)
        self._peer = peer
        if self._out.messages and not self._out.scheduled:  # sent before the connection
            self._flush()

    def _frame(self, peer: _Frames, frame: bytes) -> None:
        self.on_messages(unpack(frame))

    def _lost(self, peer: _Frames) -> None:
        if not self._closing:
            self.on_lost()

    def send(self, message: list[Any]) -> None:
        self._out.messages.append(message)
        if not self._out.scheduled:
            self._out.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._out.scheduled = False
        if self._peer is None:
            return  # not connected yet: they go once it is (``connect``)
        messages, self._out.messages = self._out.messages, []
        self._peer.write(pack(messages))

    def close(self) -> None:
        self._closing = True
        if self._peer is not None and self._peer.transport is not None:
            self._peer.transport.close()
