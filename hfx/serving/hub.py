"""The control process's side of the front processes.

With ``--api-workers N`` (N > 1) HTTP, tokenization, detokenization, SSE and the streams from
vLLM servers run in N front processes (hfx/serving/front.py); this process keeps the one place
that decides: the control plane, its policies, Migrator, Scaler, Monitor, calibration and
ledger, behind the same ``Server`` as the one-process gateway. The hub turns the fronts'
messages (hfx/serving/ipc.py) into ``Server`` calls and the control plane's events back into
messages:

- a front's ``open`` is ``Server.open`` with the front's request id, answered ``opened`` (the
  SLO applied) or ``refused`` (the same HTTP error the one-process gateway would give);
- the hub is the vLLM instances' ``Relay``: a request's stream runs in the front that owns the
  request, which reports the tokens in batches (``progress``) and the end (``ended``); the
  instance hears them as if it had read the stream itself, so failover, P/D and the Migrator
  work unchanged;
- in-process engines' tokens go to the owning front once per step (``tokens``), and every
  request's end with its record's times (``end``).

A front that dies (``front_died``, from the supervisor) has its requests aborted: queued ones
end, streams it ran are over (its connections closed with it, and vLLM aborts a request whose
client went away), in-process engines free their KV.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from hfx.backends.openai_stream import ABORTED, Ending, RelayOwner
from hfx.cluster.control import TokenEvent
from hfx.request import DEFAULT_TENANT, SLO
from hfx.sampling import SamplingParams
from hfx.serving.ipc import STATE_SECONDS, ControlSocket, front_identity
from hfx.serving.protocol import APIError
from hfx.serving.server import AppliedSLO, Server, Stream
from hfx.sim.clock import cancel

log = logging.getLogger(__name__)


class FrontHub:
    def __init__(self, server: Server, address: str, tokens_at_front: bool) -> None:
        self.server = server
        self.socket = ControlSocket(address, self._on_messages, self._channel_lost)
        # vLLM fleets: the fronts have every token already (they read the streams).
        self.tokens_at_front = tokens_at_front
        self.fronts: set[bytes] = set()
        self.heard: dict[bytes, float] = {}  # front → when its latest message came
        self.owner: dict[str, bytes] = {}  # request id → the front that answers its client
        self.streams: dict[str, Stream] = {}  # request id → its stream here (the record)
        # request id → the instance whose stream a front runs, and that stream's id
        self.relayed: dict[str, tuple[RelayOwner, int]] = {}
        self._out: dict[bytes, list[list[Any]]] = {}  # per front, in order, sent once a turn
        self._flush: asyncio.Handle | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.num_dropped = 0  # messages that did not parse or fit (logged)

        self._handlers: dict[str, Callable[..., None]] = {
            "hello": self._hello, "open": self._open, "abort": self._abort,
            "progress": self._progress, "ended": self._ended, "metrics": self._metrics,
            "alive": self._alive}

    async def start(self) -> None:
        await self.socket.start()
        self._tasks = [asyncio.get_running_loop().create_task(self._heartbeat(),
                                                              name="hub-state")]

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel(task)
        await self.socket.close()

    # ---- the vLLM instances' Relay -----------------------------------------------------------
    def open(self, owner: RelayOwner, request_id: str, stream_id: int,
             body: dict[str, Any]) -> None:
        front = self.owner.get(request_id)
        if front is None or front not in self.fronts:  # its front died meanwhile
            asyncio.get_running_loop().call_soon(owner.on_ended, request_id, stream_id,
                                                 ABORTED)
            return
        self.relayed[request_id] = (owner, stream_id)
        self.socket.send(front, ["stream", request_id, stream_id, owner.url, body])

    def cancel(self, request_id: str, stream_id: int) -> None:
        entry = self.relayed.get(request_id)
        if entry is None or entry[1] != stream_id:
            return
        front = self.owner.get(request_id)
        if front is not None and front in self.fronts:
            self.socket.send(front, ["cancel", request_id, stream_id])  # ``ended`` follows
        else:  # nobody runs it any more: its connection closed with its front
            del self.relayed[request_id]
            asyncio.get_running_loop().call_soon(entry[0].on_ended, request_id, stream_id,
                                                 ABORTED)

    # ---- fronts ------------------------------------------------------------------------------
    def _channel_lost(self, front: bytes) -> None:
        """A front's channel closed before its process was seen to exit (it stopped reading,
        or is on its way out): what it owned can no longer be answered."""
        if front in self.fronts:
            log.log(logging.INFO if self.server.draining else logging.ERROR,
                    "the channel to %s closed; its requests are aborted", front.decode())
            self._front_gone(front)

    def front_died(self, index: int) -> None:
        """Abort everything the front owned; its clients are gone with it."""
        self._front_gone(front_identity(index))

    def silent_for(self, front: bytes) -> float | None:
        """Seconds since the front's latest message; None for one not (yet) connected."""
        heard = self.heard.get(front)
        return None if heard is None else asyncio.get_running_loop().time() - heard

    def _front_gone(self, front: bytes) -> None:
        self.fronts.discard(front)
        self.heard.pop(front, None)
        self._out.pop(front, None)
        for rid in [rid for rid, f in self.owner.items() if f == front]:
            stream = self.streams.get(rid)
            if stream is not None:
                self.server.abort(stream)
            entry = self.relayed.pop(rid, None)
            if entry is not None:
                entry[0].on_ended(rid, entry[1], ABORTED)

    def _on_messages(self, front: bytes, messages: list[list[Any] | None]) -> None:
        if front in self.fronts or any(m and m[0] == "hello" for m in messages):
            self.heard[front] = asyncio.get_running_loop().time()
        for message in messages:
            if message and message[0] != "hello" and front not in self.fronts:
                # A dead front's message read after its death (or a stranger's): what it
                # asks for could never be answered.
                self.num_dropped += 1
                continue
            handler = self._handlers.get(message[0]) if message else None
            if handler is None:
                self.num_dropped += 1
                if message:
                    log.warning("dropped an unknown message %.100r", message[0])
                continue
            assert message is not None
            try:
                handler(front, *message[1:])
            except Exception:  # a malformed message: that message is lost, nothing else
                self.num_dropped += 1
                log.exception("dropped a malformed %r message", message[0])

    async def _heartbeat(self) -> None:
        while True:
            state = ["state", self.server.readiness()]
            for front in self.fronts:
                self.socket.send(front, state)
            await asyncio.sleep(STATE_SECONDS)

    def _alive(self, front: bytes) -> None:
        """A front's heartbeat: its loop runs (the time was noted on arrival)."""

    def _hello(self, front: bytes) -> None:
        self.fronts.add(front)
        self.socket.send(front, ["state", self.server.readiness()])

    def _open(self, front: bytes, rid: str, kind: str, model: str, ids: list[int],
              max_tokens: int, sampling: list[Any], slo: list[float] | None,
              priority: int | None, task: str, source: str, ignore_eos: bool,
              tenant: str = DEFAULT_TENANT) -> None:
        applied = AppliedSLO(None if slo is None else SLO(*slo), priority, task, source,
                             str(tenant))
        self.owner[rid] = front  # before submitting: it may be dispatched at once
        try:
            stream = self.server.open(kind, model, ids, max_tokens, SamplingParams(*sampling),
                                      applied, ignore_eos, request_id=rid,
                                      listener=partial(self._hear, front, rid),
                                      token_events=not self.tokens_at_front)
        except Exception as e:
            self.owner.pop(rid, None)
            if not isinstance(e, APIError):  # a bug, not the client's doing: still an answer
                log.exception("opening %s failed", rid)
                e = APIError(500, f"internal error: {type(e).__name__}: {e}",
                             kind="server_error", code="internal_error")
            self.socket.send(front, ["refused", rid, e.status, e.body(), e.headers])
            return
        applied = stream.applied
        self.socket.send(front, ["opened", rid, None if applied.slo is None else
                                 [applied.slo.ttft, applied.slo.tpot], applied.source])
        if rid in self.owner:  # not ended already (rejected at once)
            self.streams[rid] = stream

    def _abort(self, front: bytes, rid: str, finished: bool) -> None:
        stream = self.streams.get(rid)
        if stream is not None and self.owner.get(rid) == front:
            (self.server.stopped if finished else self.server.abort)(stream)

    def _progress(self, front: bytes, batch: list[list[Any]]) -> None:
        for entry in batch:
            try:
                rid, stream_id, ids, times = entry
                relayed = self.relayed.get(rid)
                if relayed is not None and relayed[1] == stream_id:
                    relayed[0].on_tokens(rid, stream_id, ids, times)
            except Exception:  # this entry is lost, not the other requests' tokens
                self.num_dropped += 1
                log.exception("dropped a malformed progress entry %.200r", entry)

    def _ended(self, front: bytes, rid: str, stream_id: int, kind: str, reason: str | None,
               message: str | None) -> None:
        relayed = self.relayed.get(rid)
        if relayed is not None and relayed[1] == stream_id:  # not an older stream's end
            del self.relayed[rid]
            relayed[0].on_ended(rid, stream_id, Ending(kind, reason, message))

    def _metrics(self, front: bytes, nonce: int) -> None:
        self.socket.send(front, ["metrics", nonce, self.server.metrics.render()])

    # ---- the control plane's events to the fronts --------------------------------------------
    def _hear(self, front: bytes, rid: str, event: TokenEvent) -> None:
        """A request's listener: tokens (in-process engines) batched per front and turn of the
        loop; the end with the record's times, after its tokens."""
        box = self._out.setdefault(front, [])
        if event.token is not None:
            if not box or box[-1][0] != "tokens":
                box.append(["tokens", {}])
            box[-1][1].setdefault(rid, []).append(event.token)
        else:
            record = self.server.control.records[rid]  # forgotten right after this call
            slo = record.slo
            box.append(["end", rid, event.finish_reason, event.error, record.outcome.value,
                        record.queue_time, record.ttft, record.e2e,
                        None if slo is None else [slo.ttft, slo.tpot], record.cached_tokens])
            self.owner.pop(rid, None)
            self.streams.pop(rid, None)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self._send_out)

    def _send_out(self) -> None:
        self._flush = None
        out, self._out = self._out, {}
        for front, box in out.items():
            if front not in self.fronts:
                continue
            for message in box:
                if message[0] == "tokens":
                    message = ["tokens", list(message[1].items())]
                self.socket.send(front, message)
