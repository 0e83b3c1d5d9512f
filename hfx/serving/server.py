"""The serving core behind the HTTP gateway: SLO resolution, validation, token streams.

Transport-free: ``Server.open(...)`` validates a request, submits it to the control plane and
returns a ``Stream`` whose ``events()`` yield token ids and then the end. The control plane, the
policy and the engines are the ones the simulator runs; here they run on the ordinary loop.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from hfx.backends.base import Service
from hfx.cluster.control import ControlPlane, Listener, TokenEvent
from hfx.cluster.tenants import TenantSpec
from hfx.model.tokenizer import Tokenizer
from hfx.request import DEFAULT_TENANT, SLO, Outcome, Request
from hfx.sampling import SamplingParams
from hfx.serving.calibrator import LiveCalibrator
from hfx.serving.metrics import Metrics
from hfx.serving.protocol import RETRY_AFTER_SECONDS, APIError, SLOBody
from hfx.serving.recorder import Recorder
from hfx.serving.tenancy import RateLimits, tenant_of
from hfx.stepmodel.latency import StepTimeModel

SLO_HEADERS = ("x-slo-ttft-ms", "x-slo-tpot-ms")  # the names llm-d uses
PRIORITY_HEADER = "x-priority"
TASK_HEADER = "x-task"


@dataclass(frozen=True, slots=True)
class AppliedSLO:
    slo: SLO | None  # None until HFX-PM maps a priority (known once submitted)
    priority: int | None
    task: str
    source: str  # body, header, priority, task, default
    tenant: str = DEFAULT_TENANT  # whose it is (hfx/serving/tenancy.py)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    model_name: str
    max_model_len: int
    default_slo: SLO
    tasks: Mapping[str, SLO]
    vocab_size: int
    placeholder_text: str | None = None  # simulated executor: the text of every token
    eos_token_id: int | None = None
    priority_levels: int = 0  # 0: priorities are refused
    stream_interval: int = 1  # tokens per SSE chunk (vLLM's --stream-interval); 1: each token
    tenant_keys: Mapping[str, str] = field(default_factory=dict)  # API key → tenant


class RecordView(Protocol):
    """What a response reads of a request's record: ``RequestRecord`` in the process that
    decides, its copy from the control process in a front (hfx/serving/front.py)."""

    outcome: Outcome
    error: str | None
    cached_tokens: int  # prompt tokens found in the engine's prefix cache

    @property
    def queue_time(self) -> float | None: ...

    @property
    def ttft(self) -> float | None: ...

    @property
    def e2e(self) -> float | None: ...


class TokenQueue:
    """A stream's events on their way to its response: put by whoever hears them, taken all at
    once by the one reader, so that tokens that arrive between two turns of the loop cost the
    reader one wake-up, and no lock or count per token as ``asyncio.Queue`` keeps."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[TokenEvent] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, event: TokenEvent) -> None:
        self._items.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[TokenEvent]:
        """Every event put since the last take, in order; waits for one if there is none."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


@dataclass(slots=True)
class Stream:
    request: Request
    record: RecordView
    applied: AppliedSLO
    queue: TokenQueue = field(default_factory=TokenQueue)

    async def take(self) -> list[TokenEvent]:
        """The events that arrived together, in order (the end comes last)."""
        return await self.queue.take()

    async def events(self) -> AsyncIterator[TokenEvent]:
        while True:
            for event in await self.queue.take():
                yield event
                if event.token is None:
                    return


class ServingCore(Protocol):
    """What the HTTP gateway (gateway.py) serves from: the embedded ``Server``, or a front
    process's ``FrontServer`` (front.py) that asks the control process."""

    options: ServeOptions
    draining: bool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def readiness(self) -> dict[str, Any]: ...

    async def render_metrics(self) -> bytes: ...

    def resolve_slo(self, body_slo: SLOBody | None, priority: int | None, task: str | None,
                    headers: Mapping[str, str]) -> AppliedSLO: ...

    def encode(self, prompt: str | list[int]) -> list[int]: ...

    def text(self, tokens: list[int]) -> str: ...

    async def open_stream(self, kind: str, model: str, prompt_ids: list[int], max_tokens: int,
                          sampling: SamplingParams, applied: AppliedSLO,
                          ignore_eos: bool = False) -> Stream: ...

    def abort(self, stream: Stream) -> None: ...

    def stopped(self, stream: Stream) -> None: ...


class Intake:
    """What turns an HTTP request into a request for the control plane, with no control plane
    in reach: SLO resolution, tokenization, the checks that need only the model's limits, and
    text from tokens. Every process that answers clients has one (the embedded ``Server``, and
    each front process of ``--api-workers N``)."""

    def __init__(self, tokenizer: Tokenizer, options: ServeOptions) -> None:
        self.tokenizer = tokenizer
        self.options = options
        self.draining = False  # shutting down: in-flight requests finish, new ones get 503

    # ---- SLOs ------------------------------------------------------------------------------
    def resolve_slo(self, body_slo: SLOBody | None, priority: int | None, task: str | None,
                    headers: Mapping[str, str]) -> AppliedSLO:
        """Body ``slo``, else the x-slo-* headers, else a priority (body or x-priority), else a
        task class (body or x-task), else the configured default."""
        task_name = task or headers.get(TASK_HEADER)
        if task_name is not None and task_name not in self.options.tasks:
            raise APIError(400, f"unknown task {task_name!r}; configured: "
                           f"{', '.join(self.options.tasks)}", param="task")
        label = task_name or "default"
        tenant = tenant_of(headers, self.options.tenant_keys)
        if body_slo is not None:
            return AppliedSLO(SLO(body_slo.ttft_ms / 1e3, body_slo.tpot_ms / 1e3), priority,
                              label, "body", tenant)
        ttft, tpot = (headers.get(h) for h in SLO_HEADERS)
        if ttft is not None or tpot is not None:
            if ttft is None or tpot is None:
                raise APIError(400, "give both x-slo-ttft-ms and x-slo-tpot-ms", param="slo")
            try:
                slo = SLO(float(ttft) / 1e3, float(tpot) / 1e3)
            except ValueError:
                raise APIError(400, "x-slo-* headers must be numbers of milliseconds",
                               param="slo") from None
            if not (slo.ttft > 0 and slo.tpot > 0):
                raise APIError(400, "SLO milliseconds must be positive", param="slo")
            return AppliedSLO(slo, priority, label, "header", tenant)
        if priority is None and PRIORITY_HEADER in headers:
            try:
                priority = int(headers[PRIORITY_HEADER])
            except ValueError:
                raise APIError(400, "x-priority must be an integer", param="priority") from None
        if priority is not None:
            if not 0 <= priority < self.options.priority_levels:
                raise APIError(400, f"priority must be in [0, {self.options.priority_levels}) "
                               "(0 is the most important)", param="priority")
            return AppliedSLO(None, priority, label, "priority", tenant)
        if task_name is not None:
            return AppliedSLO(self.options.tasks[task_name], None, label, "task", tenant)
        return AppliedSLO(self.options.default_slo, None, label, "default", tenant)

    # ---- requests --------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate: JSON allows it, UTF-8 not
                raise APIError(400, f"the prompt is not valid Unicode: {e.reason} at "
                               f"character {e.start}", param="prompt") from None
            ids = self.tokenizer.encode(prompt)
            if not ids:
                raise APIError(400, "prompt is empty", param="prompt")
            return ids
        vocab = self.options.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        return prompt

    def check_limits(self, model: str, prompt_len: int, max_tokens: int) -> None:
        """The model's name and context length: what any process can refuse at once."""
        if model != self.options.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves "
                           f"{self.options.model_name!r}", param="model", code="model_not_found")
        if prompt_len + max_tokens > self.options.max_model_len:
            raise APIError(400, f"this model's maximum context length is "
                           f"{self.options.max_model_len} tokens; the prompt has "
                           f"{prompt_len} and max_tokens is {max_tokens}",
                           param="max_tokens", code="context_length_exceeded")

    def text(self, tokens: list[int]) -> str:
        if self.options.placeholder_text is not None:
            return self.options.placeholder_text * len(tokens)
        return self.tokenizer.decode(tokens)


class Server(Intake):
    """The serving core with the control plane in this process."""

    def __init__(self, control: ControlPlane, tokenizer: Tokenizer, options: ServeOptions,
                 calibrator: LiveCalibrator | None = None,
                 tenants: Mapping[str, TenantSpec] | None = None) -> None:
        super().__init__(tokenizer, options)
        self.control = control
        # Per-tenant request and token rates (--tenants), for every front alike.
        self.limits = RateLimits(tenants or {})
        # Keeps the dispatcher's step-time model calibrated on what is served (real engines).
        self.calibrator = calibrator
        self.metrics = Metrics(control, calibrator, self.limits, frozenset(tenants or ()))
        # Where the instances run, when it holds more than they do (vLLM's warm pool): for
        # operators and tests; its close() runs after the control plane stops.
        self.placement: Any = None
        # What else runs beside the control plane while serving (the --backend healer).
        self.services: list[Service] = []
        self.recorder: Recorder | None = None  # --record: every request's row
        # From the backend (hfx/backends/base.py Served): the fronts run its streams, and the
        # fleet in a few words.
        self.streams_at_front = False
        self.fleet = ""
        self._ids = itertools.count()

    @property
    def step_model(self) -> StepTimeModel:
        """The dispatcher's step-time model, calibrated while serving if a calibrator runs."""
        return self.control.step_model

    async def start(self) -> None:
        await self.control.start()
        if self.control.scaler is not None:
            self.control.scaler.start()
        if self.calibrator is not None:
            self.calibrator.start()
        for service in self.services:
            service.start()

    async def stop(self) -> None:
        for service in self.services:
            await service.stop()
        if self.calibrator is not None:
            await self.calibrator.stop()
        await self.control.stop()
        close = getattr(self.placement, "close", None)
        if close is not None:
            await close()

    def readiness(self) -> dict[str, Any]:
        """Whether requests can be served: instances accepting work, starting, and why not."""
        control = self.control
        accepting = sum(control.accepting(i) for i in control.instances)
        starting = control.scaler.launching() if control.scaler is not None else 0
        why = "shutting down" if self.draining else control.serviceable()
        return {"ready": why is None, "instances": len(control.instances),
                "accepting": accepting, "starting": starting,
                **({"reason": why} if why is not None else {})}

    async def render_metrics(self) -> bytes:
        return self.metrics.render()

    # ---- requests --------------------------------------------------------------------------
    def check_feasible(self, slo: SLO, prompt_len: int) -> None:
        """Refuse an SLO no instance could meet even alone (HyperFlexis §3's step-time model)."""
        prefill = self.step_model.prefill_one(prompt_len)
        decode = self.step_model.decode_time(prompt_len + 1, 1)
        if slo.ttft < prefill:
            raise APIError(400, f"impossible SLO: TTFT {slo.ttft * 1e3:g} ms is below this "
                           f"prompt's prefill time alone ({prefill * 1e3:.1f} ms)", param="slo",
                           code="slo_infeasible")
        if slo.tpot < decode:
            raise APIError(400, f"impossible SLO: TPOT {slo.tpot * 1e3:g} ms is below one "
                           f"decode step ({decode * 1e3:.1f} ms)", param="slo",
                           code="slo_infeasible")

    async def open_stream(self, kind: str, model: str, prompt_ids: list[int], max_tokens: int,
                          sampling: SamplingParams, applied: AppliedSLO,
                          ignore_eos: bool = False) -> Stream:
        """What the gateway calls (a front's version asks the control process)."""
        return self.open(kind, model, prompt_ids, max_tokens, sampling, applied, ignore_eos)

    def open(self, kind: str, model: str, prompt_ids: list[int], max_tokens: int,
             sampling: SamplingParams, applied: AppliedSLO, ignore_eos: bool = False,
             request_id: str | None = None, listener: Listener | None = None,
             token_events: bool = True) -> Stream:
        """Validate and submit a request. Its events go to the returned stream's queue, or to
        ``listener`` (a front's request: hfx/serving/hub.py)."""
        self.check_limits(model, len(prompt_ids), max_tokens)
        if applied.slo is not None:
            self.check_feasible(applied.slo, len(prompt_ids))
        why = "shutting down" if self.draining else self.control.serviceable()
        if why is not None:  # nothing can take it and nothing is starting: say so now
            raise APIError(503, f"no instance can serve: {why}", kind="server_error",
                           code="unavailable",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        eos = self.options.eos_token_id
        loop = asyncio.get_running_loop()
        self.limits.admit(applied.tenant, len(prompt_ids) + max_tokens, loop.time())
        request = Request(
            id=request_id or f"{kind}-{next(self._ids)}", arrival=loop.time(),
            prompt_len=len(prompt_ids), max_tokens=max_tokens, slo=applied.slo, task=applied.task,
            priority=applied.priority, prompt_token_ids=prompt_ids, sampling=sampling,
            stop_token_ids=frozenset() if ignore_eos or eos is None else frozenset({eos}),
            tenant=applied.tenant)
        queue = TokenQueue()

        hear = listener or queue.put_nowait

        def listen(event: TokenEvent) -> None:
            hear(event)
            if event.token is None:
                self._ended(request.id)

        if self.recorder is not None:  # before submitting: it may end at once
            self.recorder.opened(request.id, applied.source)
        record = self.control.submit(request, listen, token_events)
        if record.outcome is Outcome.SHED:  # the queue is full: admission.py
            raise APIError(429, f"overloaded: {record.error}", kind="server_error",
                           code="queue_full", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        if record.slo is not None and applied.slo is None:  # mapped from the priority
            applied = replace(applied, slo=record.slo, source="priority")
        return Stream(request, record, applied, queue)

    def _ended(self, request_id: str) -> None:
        record = self.control.forget(request_id)
        if record is not None:
            self.metrics.observe(record)
            if self.recorder is not None:
                self.recorder.observe(record)
            if self.calibrator is not None:
                self.calibrator.observe(record)

    def abort(self, stream: Stream) -> None:
        """The client went away: stop the request, free its KV (outcome aborted)."""
        if stream.record.outcome is Outcome.PENDING:
            self.control.abort(stream.request.id)

    def stopped(self, stream: Stream) -> None:
        """A stop string ended the output: stop generating and free the KV, as an end of
        output (outcome finished, reason "stop"), not an abort."""
        if stream.record.outcome is Outcome.PENDING:
            self.control.abort(stream.request.id, finished=True)
