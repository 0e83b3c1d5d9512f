"""A vLLM OpenAI server as an instance: the same Instance protocol, over HTTP.

HFX keeps its queues, policies and token-level records; a request it dispatches here goes to the
server's streaming ``/v1/completions`` with token-id prompts (HFX tokenized it once),
``return_token_ids`` (each chunk carries the sampled ids, so the gateway, the records and a
retry's continuation see exactly the tokens vLLM sampled), ``X-Request-Id``, and vLLM's
``priority`` (the server runs ``--scheduling-policy priority``; lower runs first). Each chunk
becomes a StepOutput on the control plane's sink, stamped with this loop's clock, so TTFT, TPOT,
SLO accounting and metrics are the ones every other instance kind feeds.

- **Abort**: the request's stream task is cancelled, which closes its connection; vLLM aborts a
  request whose client went away (and frees its KV).
- **Stats**: the control plane's own accounting here (requests sent, their tokens so far) plus
  the server's ``/metrics``, scraped every ``scrape_interval`` seconds (docs/architecture.md
  lists which field comes from where).
- **Faults**: a stream that breaks (dropped, a malformed or error event, a 5xx, no
  finish reason, silent past ``idle_timeout``) costs that request, not the fleet: it is
  reported lost and the control plane resumes it elsewhere from the tokens it already has.
  Broken streams in a row eject the server from dispatch for a while, never the whole fleet
  (hfx/cluster/outliers.py); its running streams go on. The server leaves the fleet only when
  its health check fails too, or after ``FAILED_SCRAPES`` unanswered scrapes; then every
  request it held is reported aborted with the reason and resumed elsewhere. An attached
  server (``--backend``) that is healthy again is re-admitted (``BackendHealer``).
- **Prefix cache** (issue 47): where the server publishes its KV events (``kv_events``, the
  endpoint of its ``--kv-events-config``), the control plane's prefix index follows its blocks
  from them (``watch_cache``, hfx/backends/vllm/kv_events.py). A stream that goes silent while
  the server computes prompt blocks (its ``vllm:prefix_cache_queries_total`` less
  ``..._hits_total`` rises by ``SILENT_BLOCKS`` blocks with no message for ``SILENT_SECONDS``)
  is given up, with a warning: the index then estimates from what HFX routed there.
- **P/D** (HyperFlexis §5.1) through vLLM's KV connectors, which every server is started with: a
  prefill instance sends the prompt with ``max_tokens=1``; the connector saves the prompt's KV as
  the prefill ends, and the first token comes back as PREFILLED (the request is held here for
  the Migrator). A decode instance gets, when the migration completes, the prompt plus that
  first token for the remaining tokens; its connector loads the prompt's KV instead of computing
  it, and decoding streams from there. vLLM moves the KV; HFX decides where and when.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from hfx.backends.openai_stream import DEFAULT_IDLE_TIMEOUT, Ending, LocalRelay, Relay, new_session
from hfx.backends.vllm.kv_events import KVEventSubscriber, KVEventTranslator
from hfx.backends.vllm.metrics import ServerInfo, parse_metrics
from hfx.backends.vllm.slo_args import slo_args
from hfx.cluster.instance import EventSink
from hfx.engine import EngineError, InstanceStats, RequestStatus, Role, Sequence, StepOutput
from hfx.engine.planners.vllm import vllm_priority as priority_for
from hfx.engine.prefix_cache import CacheListener
from hfx.request import SLO, Request

if TYPE_CHECKING:
    from hfx.backends.vllm.process import ServerProcess

log = logging.getLogger(__name__)

SCRAPE_SECONDS = 0.5  # how stale the vLLM half of stats() may get
FAILED_SCRAPES = 6  # this many unanswered scrapes in a row: the server is gone
HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
# A KV event stream is given up when the server computed this many prompt blocks (each one it
# caches is published) and no message came for this long: the publisher's thread sends within
# its 0.1 s poll, the scrape lags by SCRAPE_SECONDS.
SILENT_BLOCKS, SILENT_SECONDS = 2, 10.0
UNBOUNDED_TTFT = 1e9  # a migrated request's decode has had its first token

# vLLM's finish_reason → the terminal status it means here.
_FINISHED = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH,
             "abort": RequestStatus.FINISHED_ABORTED}


def vllm_priority(request: Request, best_effort: bool) -> int:
    """The priority this request is sent with (hfx.engine.planners.vllm: the rule the
    simulated vLLM planner orders by)."""
    return priority_for(request.slo.tpot if request.slo is not None else None, best_effort)


_STREAM_IDS = itertools.count()  # unique across instances: a relay may serve several


@dataclass(slots=True)
class _Sent:
    request: Request
    stream_id: int
    tokens: int = 0
    best_effort: bool = False
    output: list[int] = field(default_factory=list)  # prefill role: its first token


class VLLMInstance:
    """The control plane's handle on one vLLM OpenAI server (and, through
    hfx/backends/openai/, on any OpenAI-compatible one: what is vLLM's own here is the request
    body, the ``/metrics`` names and the KV events)."""

    health_path = "/health"  # answers 200 while the server can serve
    metrics_path: str | None = "/metrics"  # vLLM's Prometheus page (None: the server has none)

    def __init__(self, instance_id: int, url: str, info: ServerInfo, max_num_seqs: int,
                 process: ServerProcess | None = None, role: Role = Role.COLOCATED,
                 scrape_interval: float = SCRAPE_SECONDS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, relay: Relay | None = None,
                 kv_events: str | None = None) -> None:
        self.id = instance_id
        self.role = role
        self.url = url.rstrip("/")
        self.info = info
        self.max_num_seqs = max_num_seqs
        self.process = process  # None: a server someone else runs (--backend)
        # How a released instance's server is let go (the placement's warm pool may keep it).
        self.on_stop: Callable[[ServerProcess], Awaitable[None]] | None = None
        self.scrape_interval = scrape_interval
        self.engine_metrics: dict[str, float] = {}  # the latest scrape, for operators
        # Where its streams run: this process, or the front processes.
        self.relay: Relay = relay or LocalRelay(idle_timeout)
        self._session: aiohttp.ClientSession | None = None  # made on the serving loop
        self._probe: asyncio.Future[str | None] | None = None  # a health check under way
        self._checks: set[asyncio.Task[None]] = set()  # broken streams awaiting that check
        self.faults: Counter[str] = Counter()  # broken streams by how (for operators)
        self._sent: dict[str, _Sent] = {}
        self._held: dict[str, Sequence] = {}  # prefill role: prefilled, KV saved, to migrate
        self._incoming: dict[str, Sequence] = {}  # decode role: reserved, KV on its way
        self._reserved = 0  # decode role: blocks reserved since the latest scrape
        self._sink: EventSink | None = None
        self._scraper: asyncio.Task[None] | None = None
        self._failed: str | None = None
        self._busy_since: float | None = None
        self._busy_time = 0.0
        self._stats: InstanceStats | None = None
        # Its KV events (the endpoint its publisher binds), while the index follows them.
        self.kv_events = kv_events
        self.events: KVEventTranslator | None = None
        self._subscriber: KVEventSubscriber | None = None
        self._fall_back: Callable[[], None] | None = None
        # Prompt tokens it had computed at the first scrape after the latest message, that
        # message's time, and when the index began to follow it.
        self._computed_at_event: float | None = None
        self._heard: float | None = None
        self._watched_at = 0.0

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self, sink: EventSink) -> None:
        self._sink = sink
        self._session = new_session()
        self._stats = self._snapshot({})
        self._scraper = asyncio.get_running_loop().create_task(
            self._scrape_forever(), name=f"vllm-scrape-{self.id}")

    async def stop(self) -> None:
        if self._subscriber is not None:
            await self._subscriber.stop()
        for rid, sent in list(self._sent.items()):
            self.relay.cancel(rid, sent.stream_id)
        if isinstance(self.relay, LocalRelay):
            await self.relay.close()
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
        if self._probe is not None:
            self._probe.cancel()
        if self._session is not None:
            await self._session.close()
        if self.process is not None:
            if self.on_stop is not None and self._failed is None:
                await self.on_stop(self.process)
            else:
                await self.process.stop()

    def watch_cache(self, feed: CacheListener, fall_back: Callable[[], None]) -> bool:
        """Feed the prefix index from the server's KV events, if it publishes them (False:
        it does not); ``fall_back`` when the stream goes silent. A server joining again (a
        restart) starts from nothing: the index dropped what it held."""
        if self.kv_events is None:
            return False
        if self._subscriber is not None:
            self._subscriber.cancel()
        self.events = KVEventTranslator(feed, self.info.block_size)
        self._subscriber = KVEventSubscriber(self.kv_events, self.events)
        self._subscriber.start()
        self._fall_back = fall_back
        self._computed_at_event = None  # set by the next scrape
        self._heard = None
        self._watched_at = asyncio.get_running_loop().time()
        return True

    @staticmethod
    def _computed(m: dict[str, float]) -> float:
        """Prompt tokens the server computed (looked up in its prefix cache and missed)."""
        return (m.get("vllm:prefix_cache_queries_total", 0.0)
                - m.get("vllm:prefix_cache_hits_total", 0.0))

    def _check_events(self, m: dict[str, float]) -> None:
        """After a scrape: give up a KV event stream that has gone silent while the server
        computed prompt blocks (each of which it would have published)."""
        sub = self._subscriber
        if sub is None or self._fall_back is None:
            return
        now = asyncio.get_running_loop().time()
        computed = self._computed(m)
        if self._computed_at_event is None or sub.last_at != self._heard:
            # The first scrape, or a message since the last: the count so far is accounted.
            self._computed_at_event, self._heard = computed, sub.last_at
            return
        heard = sub.last_at if sub.last_at is not None else self._watched_at
        if (now - heard < SILENT_SECONDS
                or computed - self._computed_at_event < SILENT_BLOCKS * self.info.block_size):
            return
        since = "ever" if sub.last_at is None else f"{now - sub.last_at:.0f} s"
        log.warning("instance %d (vLLM at %s): no KV event from %s for %s while it computed "
                    "%d prompt tokens; its prefix index is now HFX's estimate of what it routed "
                    "there", self.id, self.url, sub.endpoint, since,
                    computed - self._computed_at_event)
        sub.cancel()
        self._subscriber, fall_back, self._fall_back = None, self._fall_back, None
        fall_back()

    # ---- the Instance protocol --------------------------------------------------------------
    def check(self, request: Request) -> None:
        self.info.check(request.id, request.prompt_len, request.max_tokens)

    def submit(self, request: Request, best_effort: bool = False) -> None:
        if self._failed is not None:
            raise EngineError(f"instance {self.id}: {self._failed}")
        self.check(request)
        if request.prompt_token_ids is None:
            raise EngineError(f"{request.id}: a vLLM instance needs the prompt's token ids")
        self._send(request, best_effort)

    def _send(self, request: Request, best_effort: bool) -> None:
        if not self._sent:
            self._busy_since = asyncio.get_running_loop().time()
        sent = self._sent[request.id] = _Sent(request, next(_STREAM_IDS),
                                              best_effort=best_effort)
        self.relay.open(self, request.id, sent.stream_id,
                        self.body(request, best_effort, asyncio.get_running_loop().time()))

    def abort(self, request_id: str) -> None:
        sent = self._sent.get(request_id)
        if sent is not None:  # closing the connection: vLLM aborts it and frees its KV
            self.relay.cancel(request_id, sent.stream_id)
        elif self._held.pop(request_id, None) or self._incoming.pop(request_id, None):
            self._report(request_id, RequestStatus.FINISHED_ABORTED)

    def stats(self) -> InstanceStats:
        assert self._stats is not None, "start() the instance first"
        return self._stats

    def in_flight(self) -> dict[str, int]:
        """Requests streaming from this server now: id → tokens so far (for operators)."""
        return {rid: sent.tokens for rid, sent in list(self._sent.items())}

    # ---- P/D (HyperFlexis §5.1): the Migration drives these ------------------------------------
    def migration_state(self, request_id: str) -> Sequence:
        """Prefill role: the prefilled request's progress (prompt computed, first token)."""
        return self._held[request_id]

    def reserve_import(self, state: Sequence) -> bool:
        """Decode role: room for the request's KV, by the latest scrape less what was reserved
        since; False (wait for a finish) rather than let vLLM preempt."""
        if self._failed is not None:
            raise EngineError(f"instance {self.id}: {self._failed}")
        self.info.check(state.request_id, state.prompt_len, state.max_tokens)
        st = self.stats()
        needed = -(-state.num_tokens // self.info.block_size)
        if needed > st.kv_total_blocks - st.kv_used_blocks - self._reserved:
            return False
        self._reserved += needed
        self._incoming[state.request_id] = state
        return True

    def export(self, request_id: str) -> object | None:
        """Prefill role: the KV connector saved the KV as the prefill ended; let it go here."""
        self._held.pop(request_id, None)
        return None

    def activate_import(self, request_id: str, kv: object | None = None) -> None:
        """Decode role: decode the rest; the connector loads the prompt's KV."""
        state = self._incoming.pop(request_id, None)
        if state is None:
            return  # aborted while its KV was on the way
        ids = [*(state.prompt_token_ids or []), *state.output_token_ids]
        self._send(Request(
            id=request_id, arrival=0.0, prompt_len=len(ids),
            max_tokens=state.max_tokens - len(state.output_token_ids),
            slo=SLO(UNBOUNDED_TTFT, state.tpot) if state.tpot is not None else None,
            prompt_token_ids=ids, sampling=state.sampling,
            stop_token_ids=state.stop_token_ids), state.best_effort)

    def set_role(self, role: Role) -> None:
        """Between prefill and decode when drained (HyperFlexis §6): every server is started
        with the same KV connector, so either role is a matter of what HFX sends it."""
        if self._sent or self._held or self._incoming:
            raise RuntimeError(f"instance {self.id} still holds requests; drain it first")
        self.role = role

    # ---- one request ------------------------------------------------------------------------
    def body(self, request: Request, best_effort: bool, now: float) -> dict[str, Any]:
        sampling = request.sampling
        body: dict[str, Any] = {
            "model": self.info.model, "prompt": request.prompt_token_ids,
            # Prefill role: the prompt and the first token; a decode instance does the rest.
            "max_tokens": 1 if self.role is Role.PREFILL else request.max_tokens,
            "stream": True, "return_token_ids": True,
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "priority": vllm_priority(request, best_effort),
            # HFX decides where generation stops: the request's stop ids, or none at all.
            "ignore_eos": not request.stop_token_ids,
            "stop_token_ids": sorted(request.stop_token_ids),
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        slo = request.slo
        if slo is not None and not best_effort:
            # For HFX's scheduler in the server (scheduler.py): the TTFT left now, which the
            # server counts from its own arrival time, and the TPOT.
            body["vllm_xargs"] = slo_args(request.arrival + slo.ttft - now, slo.tpot)
        return body

    def on_tokens(self, rid: str, stream_id: int, tokens: list[int],
                  times: list[float]) -> None:
        """Tokens of one stream, each with the time the loop that read it read it."""
        sent = self._sent.get(rid)
        if sent is None or sent.stream_id != stream_id:
            return  # an older stream's, or after its end (the instance failed meanwhile)
        assert self._sink is not None
        sent.tokens += len(tokens)
        if self.role is Role.PREFILL:
            sent.output += tokens
        self._sink(self.id, StepOutput(times[-1], [rid] * len(tokens), tokens, [],
                                       token_times=times))

    def on_ended(self, rid: str, stream_id: int, ending: Ending) -> None:
        """The relay's word on how a stream ended."""
        sent = self._sent.get(rid)
        if sent is None or sent.stream_id != stream_id or self._failed is not None:
            return
        if ending.kind == "finished":
            self._end(rid, self._finished(rid, ending.reason or "stop"), None)
        elif ending.kind == "refused":
            self._end(rid, RequestStatus.FINISHED_FAILED, ending.message)
        elif ending.kind == "fault":
            # The stream broke: this request is lost here. Whether the server is too, its
            # health check says; meanwhile every other stream goes on.
            self.faults[ending.reason or "unknown"] += 1
            failure = f"instance {self.id} (vLLM at {self.url}): {ending.message}"
            task = asyncio.get_running_loop().create_task(self._lost(rid, stream_id, failure))
            self._checks.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._checks.discard)
        else:
            self._end(rid, RequestStatus.FINISHED_ABORTED, None)

    async def _lost(self, rid: str, stream_id: int, failure: str) -> None:
        if await self._still_healthy(failure):
            sent = self._sent.get(rid)
            if sent is not None and sent.stream_id == stream_id:
                self._end(rid, RequestStatus.FINISHED_LOST, failure)

    def _finished(self, rid: str, reason: str) -> RequestStatus:
        """The terminal status a finish reason means here."""
        sent = self._sent[rid]
        if (self.role is Role.PREFILL and reason == "length"
                and sent.request.max_tokens > sent.tokens):
            self._held[rid] = self._prefilled(sent, sent.output)
            return RequestStatus.PREFILLED
        return _FINISHED.get(reason, RequestStatus.FINISHED_STOPPED)

    @property
    def num_faults(self) -> int:
        """Broken streams, all told."""
        return self.faults.total()

    async def _still_healthy(self, fault: str) -> bool:
        """After a broken stream: one health check, shared by every stream that broke while it
        runs. A failed check fails the instance; faults alone only eject it (outliers.py)."""
        why = await self.health_check()
        if why is not None:
            self._fail(f"{fault}; its health check failed too: {why}")
            return False
        return self._failed is None

    async def health_check(self) -> str | None:
        """None if the server answers its health check, else why not; callers at the same
        time share one check."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._health())
        return await asyncio.shield(self._probe)

    async def _health(self) -> str | None:
        """None if the server answers its health check, else why not."""
        assert self._session is not None
        try:
            path = self.health_path
            async with self._session.get(f"{self.url}{path}", timeout=HEALTH_TIMEOUT) as r:
                return None if r.status == 200 else f"{path} answered {r.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return f"{type(e).__name__}: {e}"

    @staticmethod
    def _prefilled(sent: _Sent, tokens: list[int]) -> Sequence:
        """A prefilled request as the Migrator and the decode instance see it."""
        r = sent.request
        return Sequence(
            request_id=r.id, prompt_len=r.prompt_len, max_tokens=r.max_tokens,
            prompt_token_ids=r.prompt_token_ids, stop_token_ids=r.stop_token_ids,
            sampling=r.sampling, output_token_ids=list(tokens),
            num_computed_tokens=r.prompt_len, tpot=r.slo.tpot if r.slo else None,
            prefill_deadline=r.arrival + r.slo.ttft if r.slo else None,
            best_effort=sent.best_effort)

    def _end(self, rid: str, status: RequestStatus, failure: str | None) -> None:
        assert self._sink is not None
        self._sent.pop(rid)
        now = asyncio.get_running_loop().time()
        if not self._sent and self._busy_since is not None:
            self._busy_time += now - self._busy_since
            self._busy_since = None
        self._sink(self.id, StepOutput(now, [], None, [(rid, status)], failure=failure))

    def _report(self, rid: str, status: RequestStatus) -> None:
        assert self._sink is not None
        now = asyncio.get_running_loop().time()
        self._sink(self.id, StepOutput(now, [], None, [(rid, status)]))

    def _fail(self, error: str) -> None:
        """The server is gone: report every request held here as aborted, with the reason."""
        if self._failed is not None or self._sink is None:
            return
        self._failed = error
        if self._subscriber is not None:
            self._subscriber.cancel()
            self._subscriber = None
        sent, self._sent = self._sent, {}
        for rid, s in sent.items():
            self.relay.cancel(rid, s.stream_id)  # its end, when reported, finds nothing
        held = [*sent, *self._held, *self._incoming]
        self._held, self._incoming = {}, {}
        now = asyncio.get_running_loop().time()
        self._sink(self.id, StepOutput(now, [], None, [
            (rid, RequestStatus.FINISHED_ABORTED) for rid in sorted(held)], error))

    # ---- stats ------------------------------------------------------------------------------
    async def scrape(self) -> dict[str, float]:
        """/health (vLLM answers 500 once its engine died, while HTTP still works), then
        /metrics."""
        assert self._session is not None
        why = await self._health()
        if why is not None:
            raise OSError(why)
        if self.metrics_path is None:
            return {}
        async with self._session.get(f"{self.url}{self.metrics_path}",
                                     timeout=HEALTH_TIMEOUT) as r:
            r.raise_for_status()
            return parse_metrics(await r.text())

    async def _scrape_forever(self) -> None:
        misses = 0
        while self._failed is None:
            try:
                self.engine_metrics = await self.scrape()
                misses = 0
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                misses += 1
                if misses >= FAILED_SCRAPES or (self.process is not None
                                                 and not self.process.alive()):
                    self._fail(f"instance {self.id} (vLLM at {self.url}) stopped answering: "
                               f"{type(e).__name__}: {e}")
                    return
            self._stats = self._snapshot(self.engine_metrics)
            self._check_events(self.engine_metrics)
            self._reserved = 0  # the scrape counts what was reserved before it
            await asyncio.sleep(self.scrape_interval)

    def _snapshot(self, m: dict[str, float]) -> InstanceStats:
        info = self.info
        total = info.kv_total_blocks
        now = asyncio.get_running_loop().time()
        busy = self._busy_time + (now - self._busy_since if self._busy_since is not None else 0)
        started = [s for s in self._sent.values() if s.tokens]
        queued = [s for s in self._sent.values() if not s.tokens]
        return InstanceStats(
            instance_id=self.id, role=self.role, time=now,
            num_waiting=int(m.get("vllm:num_requests_waiting", len(queued))),
            num_running=int(m.get("vllm:num_requests_running", len(started))),
            num_held=len(self._held),
            kv_used_blocks=round(m.get("vllm:kv_cache_usage_perc", 0.0) * total),
            kv_waiting_blocks=sum(-(-s.request.prompt_len // info.block_size) for s in queued),
            kv_total_blocks=total, block_size=info.block_size,
            decode_ctx=sum(s.request.prompt_len + s.tokens for s in started),
            max_num_seqs=self.max_num_seqs, busy_time=busy,
            num_steps=int(m.get("vllm:iteration_tokens_total_count", 0)),
            # vLLM's own prefix-cache counters (tokens, counted at each scheduling lookup).
            prefix_queried_tokens=int(m.get("vllm:prefix_cache_queries_total", 0)),
            prefix_hit_tokens=int(m.get("vllm:prefix_cache_hits_total", 0)),
        )
