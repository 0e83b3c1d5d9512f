"""HFX's batch planner inside vLLM: a ``Scheduler`` for ``--scheduler-cls`` that plans each step
as HFX's deadline-chunked planner does (hfx/engine/planners/deadline_chunked.py), from each
request's own SLO.

Start a vLLM server with it (``hfx serve --engine vllm`` does, unless ``--vllm-scheduler
stock``)::

    vllm serve MODEL --scheduler-cls hfx.backends.vllm.scheduler.HFXScheduler \\
        --additional-config '{"hfx": {"profile": "/path/to/profile.json"}}'

with HFX importable there (``PYTHONPATH`` at HFX's checkout: this module and the planner
arithmetic it uses import only the standard library and vLLM). A request carries its SLO as
``"vllm_xargs": {"hfx_ttft_ms": 500, "hfx_tpot_ms": 50}`` (``SamplingParams.extra_args``).

Each step, before vLLM's own ``schedule`` runs:

* the prefill budget is what keeps the step within the tightest TPOT of the decoding requests
  (``pacing.time2bs``, PolyServe §4.5), from the step-time profile (``hfx profile``'s JSON,
  re-read when the file changes: ``hfx serve`` writes it once it has measured the servers),
  scaled by the pace the steps measure (``pacing.StepPace``: each step's time from
  ``schedule`` to ``update_from_output`` against the profile's prediction, never below it): a
  server that runs slower while it serves than when it was profiled gets smaller chunks;
* the first prompt to plan (one under way, else the head of the waiting queue) runs whole
  rather than in paced chunks when the chunks would cost it its TTFT and its prefill alone
  would not (``pacing.runs_whole``, HFX's deadline override); else a paced chunk;
* waiting requests start earliest TTFT deadline first, those past it or with none last
  (waiting.py), whatever priority they carry;
* the step's budget is the decodes' tokens and that chunk, and no prompt takes more than the
  chunk: every decode still has its token, as in HFX's planner, which plans decodes first.
  (vLLM visits the running list in admission order: where two prompts under way come before
  some decodes, the second's chunk may take a decode's token, as in stock vLLM.)

vLLM then schedules with that budget (``max_num_scheduled_tokens``) and that cap on a prompt's
chunk (``long_prefill_token_threshold``): preemption, aborts, prefix caching, KV connectors and
structured output are vLLM's own code, untouched. Where nothing gives the plan what it needs
(no profile yet, no request with an SLO, or a step it cannot read), vLLM schedules the step as
stock vLLM would; a request whose extra arguments are missing or malformed counts as one
without an SLO. A failure here never stops the server: the step falls back, logged once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from hfx.backends.vllm.slo_args import slo_of
from hfx.backends.vllm.waiting import DeadlineRequestQueue
from hfx.engine.planners.pacing import StepPace, runs_whole, step_time, time2bs

# Under vLLM's logger: its server log shows these beside its own.
log = logging.getLogger("vllm.hfx_scheduler")

# The deadline override's share of the time to a prompt's TTFT deadline its paced chunks may
# take (DeadlineChunkedPlanner.slack_share: HFX on tiered-4096-1024, seeds 0-2).
SLACK_SHARE = 0.4
PROFILE_CHECK_SECONDS = 1.0  # how often the profile file is looked at for a change

_COEFFICIENTS = ("prefill_a", "prefill_b", "prefill_c", "decode_a", "decode_b", "decode_c")


class _Coefficients:
    """Eq. 1 and Eq. 2's coefficients from a profile JSON (``hfx profile``'s: ``prefill`` and
    ``decode``, each ``a``, ``b``, ``c``; hfx.stepmodel.latency.Profile)."""

    __slots__ = _COEFFICIENTS

    def __init__(self, profile: dict[str, Any]) -> None:
        p, d = profile["prefill"], profile["decode"]
        self.prefill_a, self.prefill_b, self.prefill_c = _term(p, "a"), _term(p, "b"), \
            _term(p, "c")
        self.decode_a, self.decode_b, self.decode_c = _term(d, "a"), _term(d, "b"), \
            _term(d, "c")
        if self.prefill_b <= 0:
            raise ValueError("prefill b must be > 0")


def _scaled(model: _Coefficients, scale: float) -> _Coefficients:
    """``model`` with every coefficient times ``scale``: steps that run ``scale`` times slower."""
    out = _Coefficients.__new__(_Coefficients)
    for name in _COEFFICIENTS:
        setattr(out, name, getattr(model, name) * scale)
    return out


def _term(phase: dict[str, Any], name: str) -> float:
    value = float(phase[name])
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"coefficient {name} = {value}")
    return value


class _HFXPlanning:
    """The step planning, mixed in before vLLM's Scheduler (sync) or AsyncScheduler: its
    ``super()`` is that scheduler."""

    HFX_TIMES_STEPS = False  # whether a step's time is schedule() to update_from_output()

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, *args, **kwargs)  # type: ignore[call-arg]
        extra = getattr(vllm_config, "additional_config", None) or {}
        hfx = extra.get("hfx", {}) if isinstance(extra, dict) else {}
        self.hfx_profile_path: str | None = hfx.get("profile") if isinstance(hfx, dict) else None
        self.hfx_slack_share = float(hfx.get("slack_share", SLACK_SHARE)) \
            if isinstance(hfx, dict) else SLACK_SHARE
        self.hfx_model: _Coefficients | None = None
        self._hfx_profile_mtime: float | None = None
        self._hfx_profile_checked = -math.inf
        self._hfx_failed = False
        self._hfx_slos: dict[str, tuple[float | None, float | None]] = {}
        # What vLLM was configured with; each step's plan lowers them, never raises them.
        self._hfx_budget = self.max_num_scheduled_tokens  # type: ignore[attr-defined,has-type]
        self._hfx_threshold = \
            self.scheduler_config.long_prefill_token_threshold  # type: ignore[attr-defined]
        self.hfx_planned_steps = 0  # steps planned here (the rest fell back to stock)
        # The steps' measured pace against the profile; the plan scales the profile by it.
        self.hfx_pace = StepPace()
        self._hfx_step: tuple[float, float] | None = None  # (started, predicted) in flight
        # Waiting requests by TTFT deadline, the late last (waiting.py), as HFX's
        # deadline-chunked planner in the simulator orders them.
        self.waiting = DeadlineRequestQueue(self._hfx_deadline)

    # ---- inputs -----------------------------------------------------------------------------
    def _hfx_slo(self, request: Any) -> tuple[float | None, float | None]:
        slo = self._hfx_slos.get(request.request_id)
        if slo is None:
            params = getattr(request, "sampling_params", None)
            slo = self._hfx_slos[request.request_id] = slo_of(
                getattr(params, "extra_args", None))
        return slo

    def _hfx_deadline(self, request: Any) -> float | None:
        """A request's TTFT deadline (wall clock, as vLLM's ``arrival_time``); None without
        a TTFT."""
        ttft, _ = self._hfx_slo(request)
        return None if ttft is None else request.arrival_time + ttft

    def _hfx_load_profile(self) -> None:
        """(Re)read the profile when its file changed; keep the last good one otherwise."""
        path = self.hfx_profile_path
        now = time.monotonic()
        if path is None or now - self._hfx_profile_checked < PROFILE_CHECK_SECONDS:
            return
        self._hfx_profile_checked = now
        try:
            mtime = os.stat(path).st_mtime
            if mtime == self._hfx_profile_mtime:
                return
            self._hfx_profile_mtime = mtime
            with open(path) as f:
                self.hfx_model = _Coefficients(json.load(f))
            log.info("HFX scheduler: step-time profile loaded from %s", path)
        except FileNotFoundError:
            return  # not written yet: stock scheduling meanwhile
        except (OSError, ValueError, KeyError, TypeError) as e:
            self._hfx_profile_mtime = None  # looked at again at the next check
            log.warning("HFX scheduler: profile %s unreadable (%s); keeping the last one",
                        path, e)

    # ---- the plan -----------------------------------------------------------------------------
    def _hfx_plan(self) -> tuple[tuple[int, int] | None, float, int] | None:
        """None without a profile; else (the plan: token budget and a prompt's largest chunk
        for this step, None to plan as stock vLLM; the decodes' context; their count)."""
        profiled = self.hfx_model
        if profiled is None:
            return None
        scale = self.hfx_pace.scale
        model = profiled if scale == 1.0 else _scaled(profiled, scale)
        running: list[Any] = self.running  # type: ignore[attr-defined]
        decoding, prompts = [], []
        t0: float | None = None
        ctx = 0
        seen_slo = False
        for r in running:
            ttft, tpot = self._hfx_slo(r)
            seen_slo = seen_slo or ttft is not None or tpot is not None
            if r.num_output_tokens and r.num_computed_tokens >= r.num_tokens - 1:
                decoding.append(r)
                ctx += r.num_tokens
                if tpot is not None and (t0 is None or tpot < t0):
                    t0 = tpot
            else:
                prompts.append(r)
        head = prompts[0] if prompts else self._hfx_waiting_head()
        if head is not None:
            seen_slo = seen_slo or any(v is not None for v in self._hfx_slo(head))
        if head is None or not seen_slo:
            return None, ctx, len(decoding)
        full = self._hfx_budget
        paced = full if t0 is None else max(1, min(full, time2bs(model, t0, ctx, len(decoding))))
        remaining = head.num_tokens - head.num_computed_tokens
        ttft, _ = self._hfx_slo(head)
        left = None if ttft is None else head.arrival_time + ttft - time.time()
        # The prompts share the paced budget in order; a head that runs whole takes more, and
        # then nothing beside it (as TPOTChunkedPlanner._plan_prompts).
        chunk = max(paced, remaining) if runs_whole(model, remaining, paced, t0, left,
                                                    self.hfx_slack_share) else paced
        budget = min(full, len(decoding) + chunk)
        return (budget, max(1, min(chunk, budget))), ctx, len(decoding)

    def _hfx_waiting_head(self) -> Any:
        waiting = self.waiting  # type: ignore[attr-defined]
        return waiting.peek_request() if waiting else None

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        schedule = super().schedule  # type: ignore[misc]
        started = time.monotonic()
        planned = None
        if not self._hfx_failed:
            try:
                self.waiting.settle(time.time())
                self._hfx_load_profile()
                planned = self._hfx_plan()
            except Exception:  # a plan it cannot make: this step, and the rest, go stock
                self._hfx_failed = True
                log.exception("HFX scheduler: planning failed; vLLM's own scheduling from now")
        plan = planned[0] if planned is not None else None
        if plan is None:
            out = schedule(*args, **kwargs)
        else:
            config = self.scheduler_config  # type: ignore[attr-defined]
            self.max_num_scheduled_tokens, config.long_prefill_token_threshold = plan
            if not self.hfx_planned_steps:
                log.info("HFX scheduler: planning steps from each request's SLO")
            self.hfx_planned_steps += 1
            try:
                out = schedule(*args, **kwargs)
            finally:
                self.max_num_scheduled_tokens = self._hfx_budget
                config.long_prefill_token_threshold = self._hfx_threshold
        model = self.hfx_model
        if (self.HFX_TIMES_STEPS and planned is not None and model is not None
                and out.total_num_scheduled_tokens):
            _, ctx, decodes = planned
            prefill = max(0, out.total_num_scheduled_tokens - decodes)
            self._hfx_step = (started, step_time(model, ctx, decodes, prefill))
        return out

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        step, self._hfx_step = self._hfx_step, None
        if step is not None:  # schedule, execute, then this: the step's time (EngineCore.step)
            self.hfx_pace.observe(step[1], time.monotonic() - step[0])
        return super().update_from_output(*args, **kwargs)  # type: ignore[misc]

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._hfx_slos.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]


class HFXScheduler(_HFXPlanning, Scheduler):
    """vLLM's Scheduler, each step planned by HFX (module docstring)."""

    HFX_TIMES_STEPS = True


class HFXAsyncScheduler(_HFXPlanning, AsyncScheduler):
    """The same over vLLM's AsyncScheduler, for servers run with ``--async-scheduling``. Its
    steps overlap the next one's scheduling, so their pace is not measured: the profile's."""

    HFX_TIMES_STEPS = False
