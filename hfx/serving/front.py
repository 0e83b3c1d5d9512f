"""A front process of ``hfx serve --api-workers N``: the data plane.

It answers clients with the same gateway as the one-process server (gateway.py: routes, auth,
limits, validation, SSE) over a ``FrontServer``: tokenization, detokenization and the checks
that need only the model's limits happen here; what needs a decision goes to the control
process (hub.py) over the channel in ipc.py. With vLLM servers the tokens never pass through
the control process: a front reads each of its requests' streams from vLLM itself
(``upstream.relay``), writes them to its client at once, and reports them in batches
(``progress``: a request's first token within ``FIRST_TOKEN_SECONDS``, later ones within
``PROGRESS_SECONDS``) so that the ledger, SLO accounting, calibration and failover see every
token and its time.

If the control process goes silent (``CONTROL_SILENCE_SECONDS``) or dies, the front ends its
streams with an error, answers 503 with the reason, and exits non-zero: never a hang.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from hfx.backends.openai_stream import ABORTED, Ending, ending_of, new_session, relay
from hfx.cluster.control import TokenEvent
from hfx.model.tokenizer import Tokenizer
from hfx.request import SLO, Outcome, Request
from hfx.sampling import SamplingParams
from hfx.serving.ipc import CONTROL_SILENCE_SECONDS, FrontSocket
from hfx.serving.protocol import RETRY_AFTER_SECONDS, APIError
from hfx.serving.server import AppliedSLO, Intake, ServeOptions, Stream
from hfx.sim.clock import cancel

log = logging.getLogger(__name__)

# A first token reaches the control process within this: TTFT is what the dispatcher decides
# on (HFX's queue of requests awaiting one, priorities' pending first tokens).
FIRST_TOKEN_SECONDS = 0.002
# Later tokens within this, each with its own time: decode progress, which the dispatcher reads
# from Monitor snapshots a second apart. Ten times fewer messages than at 2 ms (the control
# process's cost per token at 32 streams, docs/performance.md "Relay speed").
PROGRESS_SECONDS = 0.02
WATCH_SECONDS = 0.5  # how often a front looks whether its control process is still there
ASK_TIMEOUT = 10.0  # seconds a front waits for the control process's answer to a question
EXIT_GRACE_SECONDS = 1.0  # beyond the drain, before a front that lost its control plane exits
LOST_EXIT_CODE = 3


class Progress:
    """Streamed tokens on their way to the control process, batched: one ``progress`` message
    holds every stream's tokens and their times since the last. A request's first token goes
    within ``FIRST_TOKEN_SECONDS``, taking whatever else waits with it; later tokens within
    ``PROGRESS_SECONDS``."""

    def __init__(self, send: Callable[[list[list[Any]]], None]) -> None:
        self._send = send
        # (rid, stream id) → tokens and their times not reported yet
        self._pending: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
        self._flush: asyncio.TimerHandle | None = None

    def add(self, key: tuple[str, int], ids: list[int], now: float, first: bool) -> None:
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = ([], [])
        pending[0].extend(ids)
        pending[1].extend([now] * len(ids))
        due = now + (FIRST_TOKEN_SECONDS if first else PROGRESS_SECONDS)
        if self._flush is None or self._flush.when() > due:
            if self._flush is not None:
                self._flush.cancel()
            self._flush = asyncio.get_running_loop().call_at(due, self.flush)

    def flush(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._pending:
            batch, self._pending = self._pending, {}
            self._send([[rid, sid, ids, times] for (rid, sid), (ids, times) in batch.items()])


@dataclass(slots=True)
class FrontRecord:
    """A front's copy of what the control process's record says at the end."""

    outcome: Outcome = Outcome.PENDING
    error: str | None = None
    queue_time: float | None = None
    ttft: float | None = None
    e2e: float | None = None
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class FrontSpec:
    """What a front process is started with (pickled to it)."""

    tokenizer: Tokenizer
    options: ServeOptions
    address: str  # the control process's channel
    idle_timeout: float  # vLLM streams: silence that counts as broken
    shutdown_timeout: float
    parent: int  # the control process's pid


class FrontServer(Intake):
    def __init__(self, spec: FrontSpec, index: int) -> None:
        super().__init__(spec.tokenizer, spec.options)
        self.spec = spec
        self.index = index
        self.streams: dict[str, Stream] = {}
        self.lost: str | None = None  # why the control plane is out of reach
        self._state: dict[str, Any] = {"ready": False, "reason": "connecting to the control "
                                       "plane"}
        self._heard = 0.0
        self._ids = itertools.count()
        self._prefix = f"{os.getpid():x}"  # ids stay unique across restarts of a front
        self._answers: dict[str | int, asyncio.Future[list[Any]]] = {}
        self._relays: dict[tuple[str, int], asyncio.Task[Ending]] = {}  # (rid, stream id)
        self._progress = Progress(lambda batch: self._send(["progress", batch]))
        self._delivered: dict[str, int] = {}  # request id → tokens its client got
        self._socket: FrontSocket | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._handlers: dict[str, Callable[[list[Any]], None]] = {
            "opened": self._answered, "refused": self._answered, "metrics": self._answered,
            "stream": self._stream, "cancel": self._cancel, "tokens": self._tokens,
            "end": self._end, "state": self._on_state}

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._heard = loop.time()
        self._socket = FrontSocket(self.spec.address, self.index, self._on_messages,
                                   lambda: self._control_lost("the control plane closed the "
                                                              "channel"))
        await self._socket.connect()
        self._socket.send(["hello"])
        self._session = new_session()
        self._tasks = [loop.create_task(self._watch(), name="front-watch")]

    async def stop(self) -> None:
        for task in list(self._relays.values()):
            task.cancel()
        await asyncio.gather(*self._relays.values(), return_exceptions=True)
        self._progress.flush()
        for own in self._tasks:
            await cancel(own)
        if self._session is not None:
            await self._session.close()
        if self._socket is not None:
            self._socket.close()

    def readiness(self) -> dict[str, Any]:
        if self.lost is not None:
            return {"ready": False, "reason": self.lost}
        if self.draining:
            return {**self._state, "ready": False, "reason": "shutting down"}
        return self._state

    async def render_metrics(self) -> bytes:
        """The control process's page: one /metrics for the whole process tree."""
        nonce = next(self._ids)
        answer = await self._ask(nonce, ["metrics", nonce])
        return answer[2] if isinstance(answer[2], bytes) else str(answer[2]).encode()

    # ---- requests ----------------------------------------------------------------------------
    async def open_stream(self, kind: str, model: str, prompt_ids: list[int], max_tokens: int,
                          sampling: SamplingParams, applied: AppliedSLO,
                          ignore_eos: bool = False) -> Stream:
        self.check_limits(model, len(prompt_ids), max_tokens)
        why = self.lost or ("shutting down" if self.draining else None)
        if why is not None:
            raise APIError(503, f"no instance can serve: {why}", kind="server_error",
                           code="unavailable", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        rid = f"{kind}-{self._prefix}-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        request = Request(id=rid, arrival=loop.time(), prompt_len=len(prompt_ids),
                          max_tokens=max_tokens, slo=applied.slo, task=applied.task,
                          priority=applied.priority, prompt_token_ids=prompt_ids,
                          sampling=sampling, tenant=applied.tenant)
        stream = Stream(request, FrontRecord(), applied)
        self.streams[rid] = stream  # before asking: a ``stream`` may come before ``opened``
        slo = None if applied.slo is None else [applied.slo.ttft, applied.slo.tpot]
        try:
            answer = await self._ask(rid, [
                "open", rid, kind, model, prompt_ids, max_tokens,
                [sampling.temperature, sampling.top_p, sampling.seed], slo, applied.priority,
                applied.task, applied.source, ignore_eos, applied.tenant])
        except BaseException:
            self.streams.pop(rid, None)
            self._send(["abort", rid, False])  # in case the control process took it
            raise
        if answer[0] == "refused":
            self.streams.pop(rid, None)
            _, _, status, body, headers = answer
            error = body.get("error", {})
            raise APIError(status, error.get("message", "refused"), error.get("param"),
                           error.get("code"), error.get("type", "invalid_request_error"),
                           headers)
        _, _, slo, source = answer
        if slo is not None and applied.slo is None:  # mapped from its priority
            stream.applied = replace(applied, slo=SLO(*slo), source=source)
        return stream

    def abort(self, stream: Stream) -> None:
        if stream.record.outcome is Outcome.PENDING and stream.request.id in self.streams:
            self._send(["abort", stream.request.id, False])

    def stopped(self, stream: Stream) -> None:
        if stream.record.outcome is Outcome.PENDING and stream.request.id in self.streams:
            self._send(["abort", stream.request.id, True])

    # ---- the channel -------------------------------------------------------------------------
    def _send(self, message: list[Any]) -> None:
        if self._socket is not None and self.lost is None:
            self._socket.send(message)

    async def _ask(self, key: str | int, message: list[Any]) -> list[Any]:
        if self.lost is not None:
            raise APIError(503, f"no instance can serve: {self.lost}", kind="server_error",
                           code="unavailable")
        future = asyncio.get_running_loop().create_future()
        self._answers[key] = future
        self._send(message)
        try:
            return await asyncio.wait_for(future, ASK_TIMEOUT)
        except asyncio.TimeoutError:
            raise APIError(503, "the control plane did not answer", kind="server_error",
                           code="unavailable") from None
        finally:
            self._answers.pop(key, None)

    def _on_messages(self, messages: list[list[Any] | None]) -> None:
        self._heard = asyncio.get_running_loop().time()
        for message in messages:
            handler = self._handlers.get(message[0]) if message else None
            if handler is None:
                if message:
                    log.warning("dropped an unknown message %.100r", message[0])
                continue
            assert message is not None
            try:
                handler(message)
            except Exception:  # a malformed message: that message is lost, nothing else
                log.exception("dropped a malformed %r message", message[0])

    def _answered(self, message: list[Any]) -> None:
        future = self._answers.get(message[1])
        if future is not None and not future.done():
            future.set_result(message)

    def _on_state(self, message: list[Any]) -> None:
        self._state = message[1]

    def _tokens(self, message: list[Any]) -> None:
        for rid, ids in message[1]:
            stream = self.streams.get(rid)
            if stream is not None:
                put = stream.queue.put_nowait
                for token in ids:
                    put(TokenEvent(token))

    def _end(self, message: list[Any]) -> None:
        _, rid, reason, error, outcome, queue_time, ttft, e2e, slo, cached = message
        # Read whole before the stream is let go: a malformed end raises here, and the stream
        # stays for the next end or the control plane's loss to close.
        ended, mapped = Outcome(outcome), None if slo is None else SLO(*slo)
        stream = self.streams.pop(rid, None)
        self._delivered.pop(rid, None)
        if stream is None:
            return
        record = stream.record
        assert isinstance(record, FrontRecord)
        record.outcome, record.error = ended, error
        record.queue_time, record.ttft, record.e2e = queue_time, ttft, e2e
        record.cached_tokens = int(cached)
        if mapped is not None and stream.applied.slo is None:
            a = stream.applied
            stream.applied = replace(a, slo=mapped, source="priority")
        stream.queue.put_nowait(TokenEvent(None, reason, error))

    # ---- streams from vLLM servers -----------------------------------------------------------
    def _stream(self, message: list[Any]) -> None:
        _, rid, stream_id, url, body = message
        task = asyncio.get_running_loop().create_task(
            self._relay(rid, stream_id, url, body), name=f"relay-{rid}")
        self._relays[rid, stream_id] = task
        # The end is reported from a done callback: a task cancelled before it first runs
        # never enters the coroutine, whose ``finally`` would then say nothing.
        task.add_done_callback(lambda t: self._relay_done(rid, stream_id, t))

    def _cancel(self, message: list[Any]) -> None:
        task = self._relays.get((message[1], message[2]))
        if task is not None:
            task.cancel()

    async def _relay(self, rid: str, stream_id: int, url: str, body: dict[str, Any]
                     ) -> Ending:
        assert self._session is not None
        stream = self.streams.get(rid)
        if stream is None:  # its client left meanwhile, or the control plane was lost
            return ABORTED
        loop = asyncio.get_running_loop()
        put = stream.queue.put_nowait
        # The control plane resumes a request from the tokens it has heard of; its client may
        # have more (streamed in the last batch before the stream broke): those it does not
        # get twice. The prompt sent is the request's prompt plus the tokens resumed from.
        skip = [max(0, self._delivered.get(rid, 0)
                    - (len(body.get("prompt", ())) - stream.request.prompt_len))]
        key = (rid, stream_id)

        def tokens(ids: list[int]) -> None:
            fresh = ids
            if skip[0]:
                n = min(skip[0], len(ids))
                skip[0] -= n
                fresh = ids[n:]
            for token in fresh:
                put(TokenEvent(token))  # to the client now; to the control process in a batch
            before = self._delivered.get(rid, 0)
            self._delivered[rid] = before + len(fresh)
            self._progress.add(key, ids, loop.time(), first=before == 0)

        return await relay(self._session, url, rid, body, tokens, self.spec.idle_timeout,
                           self.spec.tokenizer.encode)  # a server that streams text alone

    def _relay_done(self, rid: str, stream_id: int, task: asyncio.Task[Ending]) -> None:
        self._relays.pop((rid, stream_id), None)
        self._progress.flush()  # every token it streamed before its end, in order
        self._send(["ended", rid, stream_id, *ending_of(task).wire()])

    # ---- the control plane gone --------------------------------------------------------------
    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while self.lost is None:
            await asyncio.sleep(WATCH_SECONDS)
            self._send(["alive"])  # the control process's sign that this loop runs
            if os.getppid() != self.spec.parent:
                self._control_lost("the control plane exited")
            elif loop.time() - self._heard > CONTROL_SILENCE_SECONDS:
                self._control_lost("the control plane stopped answering")

    def _control_lost(self, why: str) -> None:
        """End every stream with the reason, answer 503 from now on, and exit non-zero."""
        if self.lost is not None:
            return  # told already (the channel closed, and then the parent changed)
        log.error("front %d: %s; exiting", self.index, why)
        self.lost = why
        for stream in list(self.streams.values()):
            stream.record.outcome = Outcome.FAILED
            stream.queue.put_nowait(TokenEvent(None, "error", why))
        for task in self._relays.values():
            task.cancel()
        self.streams.clear()
        for future in self._answers.values():
            if not future.done():
                future.set_exception(APIError(503, f"no instance can serve: {why}",
                                              kind="server_error", code="unavailable"))
        # A drain, as on SIGTERM (unless one runs), so that every stream writes its error end;
        # then the process exits non-zero. (Not PR_SET_PDEATHSIG: Linux sends it again each
        # time the dying parent's threads hand the child on, and a second SIGTERM forces an
        # exit that cuts the streams.)
        if not self.draining:
            os.kill(os.getpid(), signal.SIGTERM)
        asyncio.get_running_loop().call_later(self.spec.shutdown_timeout + EXIT_GRACE_SECONDS,
                                              os._exit, LOST_EXIT_CODE)


def run_front(spec: FrontSpec, sock: socket.socket, index: int, access: Any) -> None:
    """A front process's main: the gateway on the shared listening socket."""
    from hfx.serving.gateway import serve

    logging.basicConfig(level=logging.WARNING, format=f"front {index}: %(message)s")
    front = FrontServer(spec, index)
    serve(front, access, "", 0, spec.shutdown_timeout, sockets=[sock])
    if front.lost is not None:
        sys.exit(LOST_EXIT_CODE)
