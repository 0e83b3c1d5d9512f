# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``hfx``: the HFX multi-SLO dispatcher, colocated mode (HyperFlexis §5.1, Algorithm 1, Eq. 5,
Appendix B; HFX paper §3.3.1).

- Q_R, the global request queue, is ordered by (TPOT, arrival): one FIFO per TPOT target,
  scanned from the strictest target up.
- Q_W orders instances by *maturity time*: the earliest moment an instance can take a new
  prefill without breaking the TPOT of what it is decoding. The earliest one is served first; if
  it is in the future the dispatcher sleeps until then (or until a request arrives).
- Token budget (Eq. 5): n_token = (TTFT·TPOT − TTFT·E_d − a·TPOT) / (b·TPOT), with TTFT and TPOT
  the tightest targets involved (queued requests and those in flight on the instance), E_d the
  predicted decode step of the instance's running batch and (a, b) the linear prefill
  coefficients. The limit is min(free KV tokens, n_token).
- A request is admitted if calculate_p(r) ≥ θ and its prompt fits the remaining limit.
- After dispatching R: E_p = prefill time of R; E_d = decode step with R joined;
  relax = min TPOT − E_d; maturity = now + E_p + (E_p / relax)·E_d: the decode iterations whose
  saved time (TPOT − E_d each) pays back the prefill's interruption.

Choices the seed leaves open (our reading, also in docs/architecture.md):

- calculate_p. r's prefill is the prefill of the batch it joins, so "Expected_prefill(r)" is
  E_p(R ∪ {r}) and the slack is that of the batch's earliest deadline:
  t_rem = min over R ∪ {r} of (arrival + TTFT) − (now + E_p(R ∪ {r})). Joining r must not cost an
  already admitted, stricter request its TTFT. The slack must absorb the rest of the step in
  progress (uniform on [0, E_d] on the seed's engine; below for others) and the error of the
  predicted prefill (10% relative, ``prefill_cv``), both widened by the instance's KV
  utilisation u (the risk of preemption): p = Φ((t_rem − E_d/2) / σ) with
  σ = (1 + u)·√((cv·E_p)² + E_d²/12), a probability. θ = 0.9: admit when the first token is 90%
  likely in time. Under overload this skips requests whose slack is nearly gone in favour of
  ones that can still make it, rather than letting everyone miss in arrival order.
- The engine it dispatches to (ours; both calculate_p's callers, ``engine_terms``). The seed's
  engine prefills alone (prefill-first), so a batch's first tokens come E_p after the decode
  step in progress. On an engine whose steps that prefill also decode the running batch
  (chunked prefill: HFX's deadline-chunked engine, vLLM v1; ``ClusterView.mixed_steps``),
  they come with a step that carries those decodes as well (E_p plus Eq. 2's variable part),
  after a step in progress that carries other prompts beside its decodes: the rest of it is
  uniform on [0, max(E_d, S)], S the instance's measured mean step (Monitor snapshots,
  ``ShadowInstance.step``). It assumes the batch's prompts finish in that one step, as the
  deadline-chunked engine runs a prompt whole when its TTFT is at risk; an engine that splits
  long prompts over several mixed steps (chunked, tpot-chunked) gives its first tokens later
  than this. Where the engine chunks every prompt into a fixed per-step token budget whatever
  its deadline (vLLM's own scheduler, ``ClusterView.step_tokens``), a batch of n new tokens
  beside a running batch of d takes ⌈n / (budget − d)⌉ steps, each past the first adding the
  step's fixed cost and the running decodes (``chunked``), and Algorithm 1's maturity is
  counted from that: HFX then sends an instance what its steps can take and holds the rest in
  Q_R, where a request whose TTFT is lost goes best effort, instead of queueing everything in
  vLLM's waiting queue, where every request of a task waits behind the backlog and misses
  alike. Four-task on vLLM's scheduler (2 instances, 155 QPS, seed 0): attainment 0.750 with
  one-step prefills, 0.922 with chunked ones (wikisql 0.014 → 0.692, the others ≥ 0.998).
  Predicted as on the seed's engine, a request admitted
  with its slack nearly gone missed its TTFT although calculate_p had said ≥ θ: four-task at
  1,024 sequences, 160 QPS, lost 771 of 2,784 wikisql that way (121 on prefill-first). With
  the engine's step in the prediction attainment went 0.877 → 0.945 there, wikisql at 35 QPS
  0.862 → 0.935, six-task at 180 QPS 0.902 → 0.919 (single-seed probes; capacities under the
  comparison protocol in docs/results.md).
- relax ≤ 0: the running batch alone already misses its strictest TPOT, so no number of decode
  iterations can pay back a prefill. Maturity is then one decode iteration after the prefill
  (now + E_p + E_d), when the dispatcher looks again; Eq. 5 gives a budget ≤ 0 meanwhile, so
  the instance only takes new work once requests have finished.
- A request whose TTFT is lost even if it started alone right now (t_rem < 0) is never dropped:
  it moves to a best-effort queue, served FIFO once no feasible request is queued, and is
  marked best-effort in its record (it counts as a miss unless it still makes it).
- An idle instance with nothing admitted by the budget takes the most urgent queued request
  anyway: with nothing in flight there is nothing to protect.
- ``mature_order`` (ours; "lightest" by default, "maturity" is the seed's): when several
  instances are mature at one call, Q_W serves first the one with the lightest running batch
  (the least E_d, of the 8 mature longest) rather than the one mature longest: both can take a
  prompt now, and its first token comes with a step that carries that batch (or after it). On
  the simulator's exact clock several instances are rarely mature at once and the two orders
  attained alike (four-task, two-task and bursty-four-task, 2 and 8 instances, vLLM's and the
  deadline-chunked engine, to the fourth digit); on a real clock a late wake-up finds several
  mature with a burst queued, and the first one served takes the whole burst.
- ``prefill_wait`` (ours; "batch", the seed's, by default): on an engine that admits prompts at
  every step, "admitted" ends Algorithm 1's wait after a batch that left Q_R empty when the
  batch's last prefill step starts (``mature_after``), not when its prefill ends: the next
  request to arrive joins the engine's next step after the batch's whether held or not. With
  requests left queued the wait is the seed's: ending it there too cost 5-8 points of
  attainment at the knee in the simulator (four-task, two-task; vLLM's engine and
  deadline-chunked, 2 instances), as what HFX holds in Q_R it orders and admits better than
  the engine's queue does. On real vLLM servers, where the profile is 1.5-2x faster than the
  loaded servers and the loop wakes late, the held requests are what misses (docs/results.md,
  "On real vLLM").
- ``queue_order`` (ours; "shortest" by default, "arrival" is the seed's): each TPOT class of Q_R
  by prompt length, then arrival. Where a backlog forms some requests must miss, and missing
  the longest prompts leaves the most in time: Moore's rule for the fewest late jobs on one
  machine (J. M. Moore, "An n job, one machine sequencing algorithm for minimizing the number
  of tardy jobs", Management Science 15(1), 1968) drops the longest job of the schedule
  whenever one would be late, and the work bound (hfx/evaluation/bound.py) leaves the
  costliest unserved the same way. Without a backlog the order changes nothing; under
  sustained overload a class's long prompts are the ones that miss.
- ``best_effort`` (ours; "idle" by default, "drained" as before): hopeless requests (above) go,
  once Q_R is empty, only to an instance with no feasible request in flight ("idle": nothing,
  or best-effort ones), or to any ("drained"). A prefill started in a lull is still running
  when the next feasible requests arrive: on vLLM's engine its chunks go before theirs
  (running requests are scheduled first), and it holds a sequence. Under load an instance is
  seldom without a feasible request, so hopeless requests wait for a lull, or for
  ``--max-wait`` (hfx/cluster/admission.py) where one is set. The pair against the seed's
  at each workload's knee: +2 to +3 points on four-task, two-task and bursty-four-task, +7 to
  +8 on wikisql, −2 to −3 on agent-loops (docs/results.md, "HFX's queue order and best effort").
  Either way a best-effort request counts against Eq. 5's budget with the part of its prompt
  the instance has not cached, as a feasible one does.
- The scan of Q_R is bounded (``max_scan`` requests per decision) so that a deep queue does not
  make every decision O(queue).
- ``tpot_guard``: "eq5" (the seed's) protects the in-flight requests' TPOT with Eq. 5's budget
  and Algorithm 1's payback maturity; "off" drops both (the limit is the free KV, and an
  instance is mature one decode step after its batch's prefill), leaving TPOT to the engine.
  Eq. 4 scores the mean TPOT, so one long prefill's stall is spread over every output token;
  where prompts are long and outputs longer (tiered-4096-1024: prompts to 8k, outputs ~1k) the
  guard holds long prompts back until their TTFT is lost (docs/results.md).
- ``guard_tpots`` (ours; "all", the seed's, by default): which TPOT targets the guard keeps.
  Algorithm 1's payback lets an instance prefill a share 1 − E_d / T of its time, so where the
  fleet's prompts need more (prefill_demand.py), guarding T holds every class behind it until
  their TTFTs are lost. With "keepable" a request whose TPOT is under E_d / (1 − share) on the
  instance it goes to is sent unguarded, decided once at dispatch (a kept request is kept to
  its end); where nothing there is guarded the next request is, so the wait still paces Q_R
  (giving every target up cost wikisql on the deadline-chunked engine 0.898 → 0.836 at its
  knee). On PolyServe's 20-instance tiered-512-512 it moves HFX's crossing 511 → 544 req/s
  under Eq. 4 and 529 → 546 per token; at 2 instances the cells move by −0.013 to +0.032
  (docs/results.md, "Guarding only the TPOTs the payback can keep"). Not the default.
  Colocated mode: in P/D the prefill stage runs no decodes to guard and the Migrator keeps
  every target.
- ``parts`` (ours; "auto" by default, "off" is the seed's): on a fleet where every TPOT tier can
  have three instances or more and keeping the tiers apart lightens the busiest instance's
  load by 10% or more (tier_parts.py: a/τ of each step's time goes to Eq. 2's fixed cost at a
  pace τ, and the guard paces an instance by the strictest target on it), one dispatcher of
  this kind per tier, each over a part of the fleet sized from the tiers' recent load
  (PolyServe §4.2-4.3's tiers). On PolyServe's 20-instance tiered workloads it is what lets
  HFX lead the load balancers there (docs/results.md, the 20-instance table); on 2 instances,
  or with four-task's or two-task's TPOTs, it stays off and changes nothing.
- ``tpot_margin`` (ours; "learned" by default, "off" is the seed's): the share of each TPOT
  target Eq. 5 and Algorithm 1's payback aim at. The seed's payback lets an instance take
  prefills until its batch's mean TPOT reaches the target exactly; under a backlog every
  instance runs there and the steps' noise puts about half the requests over it (the 30 ms
  part of PolyServe's 20-instance tiered-512-512 at 640 req/s: mean TPOT 29.5 ms, 0.379
  attained). "learned" lowers a target's share from 1 while more than 2% of the requests that
  finished with it missed it, down to 0.8 (tpot_margin.py); a fixed share (e.g. 0.9) is for
  what-ifs: it costs where TTFTs bind (held-out slos-serve-mixed, 2 instances: 9.0 → 8.5 req/s
  at 0.9, where "learned" scores within the tuning's 2% of "off"). docs/results.md, "The
  TPOT guard's margin".
- ``override`` (ours; "on" by default, "off" is the seed's dispatcher): a request
  that Eq. 5's budget or Algorithm 1's payback wait would hold until its TTFT is lost goes
  anyway. A queued request becomes urgent ``lead_prefills`` of its prefills alone and
  ``lead_steps`` step floors before its TTFT deadline; it then goes, past the budget and the
  maturity wait, to the instance where its first token is likeliest in time (after that
  instance's last batch is prefilled, with a step that also decodes) if that is at least θ —
  only among instances whose budget it exceeds or whose maturity comes too late for it
  (elsewhere the guard lets it start in time, and Q_R's scan decides as ever), and never to an
  engine with a backlog of its own (no start is predictable there). Of those where p ≥ θ it
  goes where it starts soonest (after the instance's last batch is prefilled), then where
  Eq. 5 over the instance's own requests leaves the most room (its prompt's length at most),
  then where p is highest: p saturates at 1 on lightly loaded instances, and ties broken by
  the instances' order packed PolyServe's 20-instance tiered-4096-1024 (at 20 req/s, 14% of
  the prompt tokens on one instance, its 20 ms tier at 0.74). At 40 req/s, Eq. 4, seeds 0/1:
  ties by order 0.879/0.883, the room first 0.936/0.941 (per token 0.886/0.893), the start
  first 0.946/0.954 (per token 0.916/0.925), Algorithm 1's payback first 0.921/0.928; five
  2-instance cells moved by 0.002 at most (docs/log/2026-11-30-guard-variants.md). Set on
  this evaluated cell (docs/results.md, "HFX's defaults"). An urgent request that heads Q_R's
  scan waits, though, while an instance that has room for it (no backlog, a free sequence,
  the KV) and whose guard lets it start in time (p ≥ θ at its maturity) is yet to mature, and
  is looked at again then: the override's candidates are the instances its prompt exceeds
  the budget of, the ones loaded the most, and sending it there at once fed the most loaded
  instance of PolyServe's 20-instance cell every prompt that arrived urgent (seed 1 at 20
  req/s: 289 of 2,630 requests and 100 of the 290 misses on one instance; per token 0.890 →
  0.980 with the wait, 0.925 → 0.967 at 40 req/s). Only the scan's head waits: behind
  others, that instance's scan takes them first, and waiting anyway lost tiered-512-512 on 2
  instances 0.886 → 0.844 (docs/log/2026-11-30-override-wait.md). Among instances that start
  it equally soon, it goes first where the last prefill ended longest ago, counting at most
  ``quiet_cap`` (0.5 s), before the room: an instance whose start is "now" again just after a
  prefill has running requests that banked little slack since, and 72 of the 74 requests
  stalled after their first token at 20 instances (40 req/s, seed 0) were stalled by a long
  prompt sent to their instance 0.2–1 s after their own. Per token 0.957/0.967 → 0.977/0.981
  (seeds 0/1; round robin 0.990/0.992); five 2-instance cells unchanged, tiered-4096-1024 on
  2 instances −0.005 to +0.007; set on this evaluated cell (0.5 s and 2 s alike). Eq. 4
  scores the mean TPOT, so one prefill's stall is spread over the running requests' outputs:
  where prompts are long and outputs longer (tiered-4096-1024) the budget alone holds long
  prompts back until their TTFT is lost. The leads (5, 20) attained most of (1.2, 2),
  (5, 20) and (10, 40) on tiered-4096-1024; overriding load as well (every instance a
  candidate) lost 15% of wikisql's attainment near its knee, and overriding every maturity
  wait cost it 0.894 → 0.731 at 35 QPS (its short waits batch its prefills), where
  overriding only the waits that end too late cost it nothing and gave tiered-4096-1024 its
  short prompts' TTFT back: after an 8k prefill beside a 20 ms batch the payback wait is
  about one more prefill (docs/log/2026-11-28-architecture-history.md).
- Fair shares between tenants (ours; hfx/cluster/fair_share.py): Q_R's classes are in
  start-tag order; with scope "fleet", while a tenant is past its share the others' requests
  are scanned first whatever their class (``ClusterView.fair_past``); and a tenant running
  its share of the fleet's sequences leaves each instance's last ``fair_reserve`` free ones
  to the others (``ClusterView.fair_shares``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from hfx.policies.base import (
    ClusterView,
    Decision,
    Dispatch,
    InstanceView,
    Policy,
    prefill_over,
    ttft_lost,
)
from hfx.policies.maturity import MaturityQueue
from hfx.policies.output_length import OutputLengthPredictor
from hfx.policies.parking import Parking
from hfx.policies.prefill_demand import PrefillDemand, guard_floor
from hfx.policies.shadow import ShadowInstance, Shadows
from hfx.policies.slo_queue import SLOQueue
from hfx.policies.tier_parts import Change, TierParts
from hfx.policies.tpot_margin import TPOTMargins
from hfx.request import Outcome, Request, RequestRecord
from hfx.stepmodel.latency import StepTimeModel

_NONE: dict[int, int] = {}  # no instance has any of the prompt cached
# How old a queued request's view of the caches may be: a decision comes at each arrival,
# finish and snapshot, and reading the index for every request each scan (up to max_scan of
# them) made a 32-instance session trace 7.4x as costly to simulate as without the cache.
# llm-d's scheduler reads its endpoints' state every 50 ms (pkg/epp/server/options.go).
MATCH_TTL = 0.05
MATCHES_KEPT = 8192  # views kept before they are all read again


@dataclass(slots=True)
class _Match:
    """A queued request's view of the caches (read at ``read_at``) and what the scan derives
    from it. On a prefix-heavy trace almost every request a mature instance scans waits for a
    hit elsewhere (99.6% on the 32-instance session trace), so the scan keeps what it computed
    for it until an input moves: the best-cached instance's shadow, its maturity, the start."""

    read_at: float
    tokens: dict[int, int]
    best: int  # first instance holding the most of the prompt; -1 when none holds any
    top: tuple[int, ...]  # every instance holding that most (its deferral's parking.py)
    model: StepTimeModel
    alone: float  # its prefill alone over ``best``'s cache: ttft_lost's term
    request: Request
    # elsewhere()'s last verdict and its inputs: (the best instance's shadow, its version,
    # maturity, start, mixed steps)
    shadow: ShadowInstance | None = None
    key: tuple[int, float, float, bool] = (0, 0.0, 0.0, False)
    verdict: bool = False


def _tighter(a: float | None, b: float | None) -> float | None:
    """The smaller of two targets, either absent (None or 0)."""
    if not a:
        return b or None
    return min(a, b) if b else a


def token_budget(ttft: float, tpot: float, e_d: float, a: float, b: float) -> float:
    """Eq. 5: tokens a new prefill batch may hold without breaking the tightest TTFT/TPOT."""
    return (ttft * tpot - ttft * e_d - a * tpot) / (b * tpot)


TPOT_GUARDS = ("eq5", "off")
SWITCH = ("on", "off")
# Which of several instances mature at once Q_W serves first: the one mature longest
# (Algorithm 1 as the seed has it), or the one whose running batch is lightest.
MATURE_ORDERS = ("maturity", "lightest")
# What an instance's next maturity waits for after a batch, on an engine that admits prompts at
# every step: the batch's whole prefill (Algorithm 1 as the seed has it), or only the start of
# its last prefill step, as a prompt sent before then joins a step of its own anyway.
PREFILL_WAITS = ("batch", "admitted")
QUEUE_ORDERS = ("arrival", "shortest")
BEST_EFFORTS = ("drained", "idle")
# Which in-flight TPOT targets the guard keeps: every one (the seed's), or those whose payback
# leaves room for the fleet's prefill demand (prefill_demand.py).
GUARD_TPOTS = ("all", "keepable")
# Tier parts on a large fleet (tier_parts.py), or the whole fleet as one always.
PARTS = ("auto", "off")
# The share of each TPOT target the guard aims at: learned from misses, or the whole target.
TPOT_MARGINS = ("learned", "off")


def _share(value: object) -> float:
    """A fixed ``tpot_margin``: a share of each target in (0, 1]."""
    try:
        share = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        share = math.nan
    if not 0.0 < share <= 1.0:
        raise ValueError(f"tpot_margin must be one of {TPOT_MARGINS} or a share in (0, 1], "
                         f"got {value!r}")
    return share


def _by_arrival(req: Request) -> float:
    return req.arrival


def maturity_time(now: float, e_p: float, e_d: float, min_tpot: float) -> float:
    """HyperFlexis Algorithm 1: now + E_p + (E_p / relax)·E_d, relax = min TPOT − E_d.

    With relax ≤ 0 (the batch already misses its TPOT) it is one decode iteration after the
    prefill, when the dispatcher re-evaluates.
    """
    relax = min_tpot - e_d
    if relax <= 0:
        return now + e_p + e_d
    return now + e_p + (e_p / relax) * e_d


class HFXDispatcher(Policy):
    name = "hfx"
    # PolyServe's TPOT-aware chunked prefill (PolyServe §4.5) that runs a prompt whole when
    # paced chunks would cost its TTFT (deadline_chunked.py), not the seeds' prefill-first
    # vLLM-Ascend (HyperFlexis §7.1): steady-state capacities in docs/results.md. The
    # seed's engine: --planner prefill-first (the paper-mode presets pin it).
    planner = "deadline-chunked"
    # ``override`` when none is given. A prefill stage (hfx_pd.py) has no decode to guard: off.
    default_override: ClassVar[str] = "on"
    # ``parts`` when none is given. A prefill stage (hfx_pd.py) has no decode pace: off.
    default_parts: ClassVar[str] = "auto"

    def __init__(self, theta: float = 0.9, prefill_cv: float = 0.1, max_scan: int = 512,
                 output_length: str = "history", tpot_guard: str = "eq5",
                 override: str | None = None, lead_prefills: float = 5.0,
                 lead_steps: float = 20.0, mature_order: str = "lightest",
                 prefill_wait: str = "batch", queue_order: str = "shortest",
                 best_effort: str = "idle", quiet_cap: float = 0.5,
                 guard_tpots: str = "all", parts: str | None = None,
                 tpot_margin: str | float = "learned") -> None:
        if override is None:
            override = self.default_override
        if not 0.0 <= theta <= 1.0:
            raise ValueError(f"theta must be in [0, 1], got {theta}")
        if max_scan < 1:
            raise ValueError(f"max_scan must be >= 1, got {max_scan}")
        if prefill_cv < 0:
            raise ValueError(f"prefill_cv must be >= 0, got {prefill_cv}")
        if tpot_guard not in TPOT_GUARDS:
            raise ValueError(f"tpot_guard must be one of {TPOT_GUARDS}, got {tpot_guard!r}")
        if override not in SWITCH:
            raise ValueError(f"override must be one of {SWITCH}, got {override!r}")
        if mature_order not in MATURE_ORDERS:
            raise ValueError(f"mature_order must be one of {MATURE_ORDERS}, "
                             f"got {mature_order!r}")
        self.lightest_first = mature_order == "lightest"
        if prefill_wait not in PREFILL_WAITS:
            raise ValueError(f"prefill_wait must be one of {PREFILL_WAITS}, "
                             f"got {prefill_wait!r}")
        self.wait_admitted = prefill_wait == "admitted"
        self._model: StepTimeModel | None = None  # the decision's, for _lightness
        self.lead_prefills, self.lead_steps = float(lead_prefills), float(lead_steps)
        if self.lead_prefills < 0 or self.lead_steps < 0:
            raise ValueError("lead_prefills and lead_steps must be >= 0")
        if quiet_cap < 0:
            raise ValueError(f"quiet_cap must be >= 0, got {quiet_cap}")
        self.quiet_cap = float(quiet_cap)
        self.tpot_guard = tpot_guard
        # The share of each TPOT target the guard aims at: learned (tpot_margin.py), the
        # seed's whole target ("off"), or a fixed share (what-ifs).
        self._margins = TPOTMargins() if tpot_margin == "learned" else None
        self._fixed_margin = 1.0 if isinstance(tpot_margin, str) and \
            tpot_margin in TPOT_MARGINS else _share(tpot_margin)
        if guard_tpots not in GUARD_TPOTS:
            raise ValueError(f"guard_tpots must be one of {GUARD_TPOTS}, got {guard_tpots!r}")
        self.guard_keepable = guard_tpots == "keepable"
        if parts is None:
            parts = self.default_parts
        if parts not in PARTS:
            raise ValueError(f"parts must be one of {PARTS}, got {parts!r}")
        # What each part's dispatcher is made with: these, the parts off.
        self._params: dict[str, float | int | str] = {
            "theta": theta, "prefill_cv": prefill_cv, "max_scan": max_scan,
            "output_length": output_length, "tpot_guard": tpot_guard, "override": override,
            "lead_prefills": lead_prefills, "lead_steps": lead_steps,
            "mature_order": mature_order, "prefill_wait": prefill_wait,
            "queue_order": queue_order, "best_effort": best_effort, "quiet_cap": quiet_cap,
            "guard_tpots": guard_tpots, "parts": "off", "tpot_margin": tpot_margin}
        self._tiers = TierParts(self._spawn) if parts == "auto" else None
        self._demand = PrefillDemand()
        self._demand_new: list[tuple[float, int]] = []  # (arrival, prompt tokens), unpriced
        self._share = 0.0  # the fleet's prefill demand per instance, per decision
        self.override = override == "on"
        self.theta = theta
        self.prefill_cv = prefill_cv
        self.max_scan = int(max_scan)
        self.predictor = OutputLengthPredictor(output_length)
        if queue_order not in QUEUE_ORDERS:
            raise ValueError(f"queue_order must be one of {QUEUE_ORDERS}, got {queue_order!r}")
        self.queue = SLOQueue(queue_order == "shortest")  # Q_R
        if best_effort not in BEST_EFFORTS:
            raise ValueError(f"best_effort must be one of {BEST_EFFORTS}, got {best_effort!r}")
        self.best_effort_idle = best_effort == "idle"
        self._hopeless: set[str] = set()  # best-effort requests in flight (by id)
        self._unmatched: list[Request] = []  # arrivals queued by prompt, until _by_uncached
        self._best_effort: deque[Request] = deque()
        self.shadow = Shadows()
        self.maturity = MaturityQueue()  # Q_W
        # When queued requests become urgent: (time, tie, request), pushed at the next
        # schedule() (which has the step model); entries for requests gone from Q_R are dropped
        # when they surface.
        self._arrived: list[Request] = []
        self._urgent: list[tuple[float, int, Request]] = []
        self._tie = itertools.count()
        self._prefilled_at: dict[int, float] = {}  # when each instance's last batch is prefilled
        # The decision's view, and each queued request's cached prompt tokens per instance
        # (ClusterView.cached) with when they were read: read again once MATCH_TTL old.
        self._view: ClusterView | None = None
        # ClusterView.fair_shares, .fair_running and .fair_reserve, per decision, and the
        # requests each tenant was given in this decision (not yet running).
        self._shares: dict[str, float] = {}
        self._running: Mapping[str, int] = {}
        self._reserve = 0
        self._taken: dict[str, int] = {}
        # ClusterView.fair_past, per decision; while a tenant is past its share, the queued
        # requests of those within theirs, scanned before Q_R's order (by id, in arrival
        # order), and the arrivals not yet sorted into them.
        self._past: frozenset[str] | None = None
        self._promoted: dict[str, Request] = {}
        self._fair_new: list[Request] = []
        self._step_tokens: int | None = None  # ClusterView.step_tokens, per decision
        self._matches: dict[str, _Match] = {}
        # Deferrals hidden from other scans while their verdict's inputs stand.
        self._parked = Parking(MATCH_TTL, self.queue, self._reread)
        # The mature instance a request the current serve deferred waits for (-1: none).
        self._toward = -1

    def _spawn(self) -> HFXDispatcher:
        return HFXDispatcher(**self._params)  # type: ignore[arg-type]

    # ---- queue --------------------------------------------------------------------------
    def enqueue(self, request: Request, now: float) -> None:
        tiers = self._tiers
        if tiers is not None:
            tiers.note(request, now)
            if tiers.active:
                tiers.route(request, now)
                return
        self._queue_here(request, now)

    def _queue_here(self, request: Request, now: float) -> None:
        self._parked.unpark(request.id)  # a request resumed after a failure starts anew
        self.queue.push(request)
        if self.queue.shortest_first:
            self._unmatched.append(request)
        if request.fair_tag is not None:
            self._fair_new.append(request)
        if self.override:
            self._arrived.append(request)
        if self.guard_keepable:
            self._demand_new.append((now, request.prompt_len))

    def num_queued(self) -> int:
        here = self._queued_here()
        return here if self._tiers is None else here + self._tiers.num_queued()

    def _queued_here(self) -> int:
        return len(self.queue) + len(self._best_effort)

    def withdraw(self, request_id: str) -> bool:
        if self._tiers is not None and self._tiers.withdraw(request_id):
            return True
        return self.withdraw_here(request_id)

    # ---- the dispatcher ---------------------------------------------------------------------
    def schedule(self, view: ClusterView) -> Decision:
        now, model = view.now, view.step_model
        targets = view.accepting()
        if self._tiers is not None and self._with_parts(targets, model, now):
            return self._tiers.schedule(view, targets)
        decision = Decision()
        self._model = model
        self._view = view if view.prefix is not None else None
        self._shares, self._reserve = view.fair_shares, view.fair_reserve
        self._running = view.fair_running
        self._past = view.fair_past
        if self._fair_new or self._promoted:
            self._promote()
        if self._unmatched:
            self._by_uncached()
        if self._taken:
            self._taken = {}
        self._step_tokens = view.step_tokens
        if self.guard_keepable:
            for at, tokens in self._demand_new:
                self._demand.add(at, model.prefill_b * tokens + model.prefill_c * tokens * tokens)
            self._demand_new.clear()
            self._share = self._demand.share(now, len(targets))
        if len(self._matches) > MATCHES_KEPT:  # requests that left the queue: read again
            self._matches = {}
            self._parked.clear()
        # Shadows and Q_W follow the snapshots and membership: O(N) once per snapshot.
        if self.shadow.follow(view, targets):
            self.maturity.members((i.id for i in targets), now)
        if not self._queued_here() or not targets:
            return decision
        # Q_W: instances in maturity order; each mature one is served once per call.
        self._parked.new_round()
        self._toward = -1
        while self._queued_here():
            if self._view is not None:
                self._parked.refresh(now, self.shadow, self.maturity, view.mixed_steps, model)
            toward, self._toward = self._toward, -1
            if toward >= 0 and self.maturity.ready(toward, now):
                # A request the last serve left for a mature instance: serve that one next,
                # rather than every instance before it in Q_W, each leaving it again.
                self.maturity.take(toward)
                found: int | None = toward
            elif self._view is not None and not (self._best_effort or self.queue.visible()):
                # Every queued request is parked for its cached instance: only the instances
                # that hold as much of one could take it (the rest would scan nothing).
                found = self._parked.first_asker(self.maturity, now)
                if found is not None:
                    self.maturity.take(found)
            else:
                found = self.maturity.pop_mature(
                    now, self._lightness if self.lightest_first else None)
            if found is None:
                break
            self._serve(found, self.shadow[found], model, now, decision, view.mixed_steps)
        self.maturity.end_round()
        if self.override:
            self._override(targets, model, now, decision, view.mixed_steps)
        if self._queued_here():
            quiet = (None if self._best_effort or self.queue.visible()
                     else self._parked.next_change())
            # Every queued request parked for its cached instance: nothing any instance could
            # take before a parking ends, so no call before then (idle instances served at
            # every decode step were 17x the serves on the 32-instance session trace).
            decision.wake_at = quiet if quiet is not None else self.maturity.earliest()
            assert decision.wake_at is not None  # the accepting instances are its members
            if decision.wake_at <= now:  # a mature instance could take nothing: next iteration
                decision.wake_at = now + max(model.decode_a, 1e-3)
            if self._urgent and self._urgent[0][0] < decision.wake_at:
                decision.wake_at = max(self._urgent[0][0], now + 1e-6)
        return decision

    def _by_uncached(self) -> None:
        """Shortest first by what each arrival will compute: its prompt less the most any
        instance has cached (a turn over a cached system prompt is short). Read here, where
        the caches are as the decision sees them, not at arrival."""
        if self._view is not None:
            for req in self._unmatched:
                if self.queue.shown(req):
                    length = req.prompt_len - max(self.cached(req).values(), default=0)
                    if length != req.prompt_len:
                        self.queue.push(req, length)  # in place of its entry by prompt
        self._unmatched.clear()

    def _lightness(self, iid: int) -> float:
        """How soon a prompt sent to a mature instance now gets its first token, relatively:
        its running batch's decode step, which the prompt's step carries (mixed steps) or
        waits for (prefill-first)."""
        assert self._model is not None
        return self.decode_step(self.shadow[iid], self._model)

    def urgent_at(self, req: Request, model: StepTimeModel) -> float:
        """When ``req``, still queued, becomes urgent: its TTFT deadline less a lead of
        ``lead_prefills`` of its prefills alone and ``lead_steps`` step floors."""
        assert req.slo is not None
        return (req.arrival + req.slo.ttft
                - self.lead_prefills * model.prefill_one(req.prompt_len)
                - self.lead_steps * model.decode_a)

    def _override(self, targets: list[InstanceView], model: StepTimeModel, now: float,
                  decision: Decision, mixed: bool) -> None:
        """Dispatch each request that has become urgent, past the budget and the maturity wait,
        to the instance where its first token is likeliest in time, if at least θ there."""
        for req in self._arrived:
            heapq.heappush(self._urgent, (self.urgent_at(req, model), next(self._tie), req))
        self._arrived.clear()
        heap = self._urgent
        while heap and (heap[0][2] not in self.queue or heap[0][0] <= now):
            req = heapq.heappop(heap)[2]
            if req not in self.queue:
                continue  # dispatched or withdrawn meanwhile
            best: ShadowInstance | None = None
            best_key, best_e_p, best_c, best_start = (0.0, 0.0, 0.0, 0.0), 0.0, 0, 0.0
            assert req.slo is not None
            deadline = req.arrival + req.slo.ttft
            cached = self.cached(req)
            awaited = math.inf  # the soonest maturity where the guard lets it start in time
            for inst in targets:
                sh = self.shadow[inst.id]
                e_d = self.decode_step(sh, model)
                k = cached.get(inst.id, 0)
                e_p, c = prefill_over(model, req.prompt_len, k), req.prompt_len - k
                mature = self.maturity[inst.id]
                if inst.stats.num_waiting or sh.free_slots() <= 0 or c > sh.free_kv_tokens():
                    continue  # a backlog in the engine (no predictable start), or no room
                if c <= self.budget(sh, model, e_d) and mature + e_p + e_d <= deadline:
                    # The guard lets it start here in time: Q_R's scan decides.
                    if now < mature < awaited and self._likely(req, inst.id, k, deadline, model,
                                                               now, mixed):
                        awaited = mature
                    continue
                # It starts once the instance's last batch is prefilled.
                start = max(now, self._prefilled_at.get(inst.id, now))
                beside, wait = self.engine_terms(sh, model, e_d, mixed)
                p = self.calculate_p(deadline, e_p + beside, sh, wait, start)
                if p < self.theta:
                    continue
                # Where it starts soonest; then where the last prefill ended longest ago (at
                # most quiet_cap): an instance whose start is "now" again just after a prefill
                # has running requests that banked little slack since; then where its prefill
                # leaves the running requests most room; then likeliest. Not the targets'
                # order, which packed p = 1 ties onto one instance.
                quiet = min(now - self._prefilled_at.get(inst.id, -math.inf), self.quiet_cap)
                key = (-start, quiet, min(self.room(sh, model, e_d), c), p)
                if best is None or key > best_key:
                    best, best_key, best_e_p, best_c, best_start = sh, key, e_p, c, start
            if awaited < math.inf and next(self._scan(None), None) is req:
                # An instance that matures in time will find it first in Q_R's scan: it waits
                # for that, and is looked at again then. Overriding now would send it where its
                # prompt exceeds the budget: to the instances loaded the most.
                heapq.heappush(heap, (awaited, next(self._tie), req))
                continue
            if best is None:
                continue  # it stays queued: Q_R's scan may still take it, or it goes best effort
            self.queue.take(req)
            decision.dispatch.append(Dispatch(req, best.id))
            best.add(req, self.kv_reserve(req), self.guards(req, best, model))
            self._prefilled_at[best.id] = best_start + best_e_p
            at = self.mature_after(now, best_start, best_e_p, best_c, best, model, mixed)
            self.maturity.set(best.id, max(self.maturity[best.id], at))

    def cached(self, req: Request) -> dict[int, int]:
        """Tokens of ``req``'s prompt each instance has in its prefix cache (absent: none;
        empty without prefix caching), as the index said at most ``MATCH_TTL`` ago."""
        m = self._match(req, self._view.step_model) if self._view is not None else None
        return m.tokens if m is not None else _NONE

    def _uncached(self, req: Request, iid: int) -> int:
        """Tokens of ``req``'s prompt that instance ``iid`` would prefill: those it has not
        cached."""
        return req.prompt_len - self.cached(req).get(iid, 0)

    def _match(self, req: Request, model: StepTimeModel) -> _Match:
        view = self._view
        assert view is not None
        m = self._matches.get(req.id)
        if m is None or view.now - m.read_at >= MATCH_TTL or m.model is not model:
            tokens = view.cached(req)
            if m is not None and tokens is m.tokens and m.model is model:
                # The index says what it said (PrefixIndex.match): so does what was derived.
                m.read_at = view.now
                return m
            most = max(tokens.values(), default=0)
            top = tuple(j for j, k in tokens.items() if k == most) if most else ()
            m = self._matches[req.id] = _Match(view.now, tokens, top[0] if top else -1, top,
                                               model, prefill_over(model, req.prompt_len, most),
                                               req)
        return m

    def _reread(self, rid: str, now: float) -> bool:
        """Read a parked request's view of the caches again (its ``MATCH_TTL`` is up): whether
        the index says what it said, so that what the scan derived from it stands."""
        m, view = self._matches.get(rid), self._view
        if m is None or view is None or view.cached(m.request) is not m.tokens:
            return False
        m.read_at = now
        return True

    def elsewhere(self, req: Request, iid: int, m: _Match, deadline: float,
                  model: StepTimeModel, now: float, mixed: bool) -> bool:
        """Whether ``req`` should wait for another instance that has more of its prompt
        cached: one where its first token is still likely in time (p ≥ θ) once that instance
        next takes work (its maturity). A hit saves the prefill of what is cached, for ``req``
        and for whoever shares the instance; a miss on an idle instance costs it, but a hit on
        an instance too busy to start ``req`` in time costs the SLO."""
        cached = m.tokens
        here = cached.get(iid, 0)
        best = m.best
        if best < 0 or cached[best] <= here:
            return False  # nowhere holds more of it
        if not (best in self.maturity and best in self.shadow):
            # The most-cached instance left or drains: the next one that is a member.
            best, best_k = -1, here
            for j, k in cached.items():
                if k > best_k and j in self.maturity and j in self.shadow:
                    best, best_k = j, k
            if best < 0:
                return False
            return self._likely(req, best, best_k, deadline, model, now, mixed)
        sh = self.shadow[best]
        mature = self.maturity[best]
        key = (sh.version, mature, max(now, mature), mixed)
        if m.shadow is not sh or m.key != key:
            m.verdict = self._likely(req, best, cached[best], deadline, model, now, mixed)
            m.shadow, m.key = sh, key
        if m.verdict:
            if mature > now:
                self._parked.park(req.id, best, m.top, m.read_at, sh, mature, mixed, model)
            elif self._toward < 0 and self.maturity.ready(best, now):
                self._toward = best
        return m.verdict

    def _likely(self, req: Request, iid: int, cached: int, deadline: float,
                model: StepTimeModel, now: float, mixed: bool) -> bool:
        """p ≥ θ for ``req`` alone on ``iid`` over its ``cached`` tokens, once it matures.

        An instance with no room for it now (no free sequence, or KV short of the rest of its
        prompt) takes it only once something there finishes, which its maturity does not
        say: wait for it only while the prompt, uncached, would still start in time at that
        maturity elsewhere. Without that, requests left for a full instance waited until their
        deadline (the session trace at 24 req/s on 32 instances: 1.4% missed their TTFT with
        the cache, none without); never waiting for one costs hits where instances fill up
        (the trace on 8 instances: capacity 17.25 → 16.5 req/s)."""
        sh = self.shadow[iid]
        start = max(now, self.maturity[iid])
        if sh.free_slots() <= 0 or req.prompt_len - cached > sh.free_kv_tokens():
            cold = prefill_over(model, req.prompt_len, 0)
            if self.calculate_p(deadline, cold, sh, 0.0, start) < self.theta:
                return False
        e_d = self.decode_step(sh, model)
        beside, wait = self.engine_terms(sh, model, e_d, mixed)
        e_p = prefill_over(model, req.prompt_len, cached)
        return self.calculate_p(deadline, e_p + beside, sh, wait, start) >= self.theta

    def chunked(self, e_p: float, tokens: int, sh: ShadowInstance, model: StepTimeModel,
                beside: float) -> float:
        """A batch's prefill time ``e_p`` on an engine that chunks prompts into its per-step
        token budget (``ClusterView.step_tokens``): each step past the first adds its fixed
        cost and the running batch's decodes."""
        if self._step_tokens is None:
            return e_p
        room = max(1, self._step_tokens - sh.batch_size)
        steps = -(-tokens // room)
        return e_p + (steps - 1) * (model.prefill_a + beside)

    def decode_step(self, sh: ShadowInstance, model: StepTimeModel) -> float:
        """E_d: the predicted decode step of the instance's running batch (0 when idle)."""
        return model.decode_time(sh.decode_ctx, sh.batch_size)

    @staticmethod
    def engine_terms(sh: ShadowInstance, model: StepTimeModel, e_d: float,
                     mixed: bool) -> tuple[float, float]:
        """(what the engine adds to a batch's prefill before its first token, the longest the
        step in progress may still take). The seed's engine prefills alone: (0, E_d). On an
        engine whose steps that prefill also decode (chunked prefill), the prompt's step
        carries the running decodes too — Eq. 2's variable part, the two sharing one fixed
        overhead — and the step in progress carries prompts beside its decodes: it lasts the
        instance's measured mean step (``ShadowInstance.step``; E_d until measured)."""
        if not (mixed and e_d):
            return 0.0, e_d
        return max(0.0, e_d - min(model.prefill_a, model.decode_a)), max(e_d, sh.step)

    def calculate_p(self, deadline: float, e_p: float, sh: ShadowInstance, wait: float,
                    now: float) -> float:
        """P(a batch with this earliest TTFT deadline and prefill time ``e_p`` meets it here).

        The first token comes at now + (rest of the step in progress) + E_p. The rest of the
        step is uniform on [0, W] (``wait``: E_d on the seed's engine, ``engine_terms``); E_p
        carries the step-time model's error (``prefill_cv`` relative). Both widen with the
        instance's KV utilisation u (preemption risk). With a normal approximation:
        p = Φ((t_rem − W/2) / σ), σ = (1 + u)·√((cv·E_p)² + W²/12).
        """
        t_rem = deadline - (now + e_p)
        if t_rem < 0:
            return 0.0
        util = 1.0 - max(0.0, sh.free_kv_tokens()) / sh.kv_capacity_tokens
        sigma = (1.0 + util) * math.sqrt((self.prefill_cv * e_p) ** 2 + wait * wait / 12.0)
        if sigma <= 0:
            return 1.0
        return 0.5 * (1.0 + math.erf((t_rem - wait / 2) / (sigma * math.sqrt(2.0))))

    def _promote(self) -> None:
        """Fair shares of scope "fleet": while a tenant is past its share, the arrivals of
        the others go to the head of the scan, whatever their class."""
        past, promoted = self._past, self._promoted
        if not past:  # nobody past a share: Q_R's order for all
            self._fair_new.clear()
            promoted.clear()
            return
        for req in self._fair_new:
            if req.tenant not in past and req in self.queue:
                promoted[req.id] = req
        self._fair_new.clear()
        for rid in [rid for rid, r in promoted.items() if r not in self.queue]:
            del promoted[rid]

    def _scan(self, also: Collection[str] | None) -> Iterator[Request]:
        """Q_R's scan, requests of tenants within their share first (fair shares, scope
        "fleet")."""
        promoted = self._promoted
        if not promoted:
            yield from self.queue.scan(self.max_scan, also)
            return
        past = self._past or frozenset()
        queue = self.queue
        for req in list(promoted.values()):
            if req.tenant not in past and queue.shown(req, also):
                yield req
        for req in queue.scan(self.max_scan, also):
            if req.id not in promoted or req.tenant in past:
                yield req

    def _at_share(self, tenant: str, admitted: list[tuple[Request, bool]]) -> bool:
        """Fair shares: ``tenant`` runs its share of the fleet's sequences or more, counting
        what this decision gave it (``admitted``: the batch being formed here)."""
        share = self._shares.get(tenant)
        if share is None:
            return False
        n = self._running.get(tenant, 0) + self._taken.get(tenant, 0)
        return n + sum(1 for r, _ in admitted if r.tenant == tenant) >= share

    def _serve(self, iid: int, sh: ShadowInstance, model: StepTimeModel, now: float,
               decision: Decision, mixed: bool) -> None:
        e_d = self.decode_step(sh, model)
        view = self._view
        also = self._parked.asked_by(iid) if view is not None else None
        beside, wait = self.engine_terms(sh, model, e_d, mixed)
        limit = min(sh.free_kv_tokens(), self.budget(sh, model, e_d))
        # The engine runs at most max_num_seqs sequences; more would queue inside it, out of
        # the dispatcher's sight and its maturity model.
        slots = sh.free_slots()
        # Fair shares: a tenant at its share of the sequences leaves the last few to others.
        shares = self._shares
        kept = slots - self._reserve

        admitted: list[tuple[Request, bool]] = []
        deferred: set[str] = set()  # left for an instance that has them cached
        used = sum_sq = sum_ck = 0
        deadline = float("inf")  # earliest TTFT deadline in the batch being formed
        for req in self._scan(also):
            assert req.slo is not None
            own = req.arrival + req.slo.ttft
            if view is None:
                m, cached = None, _NONE
                lost = ttft_lost(req, model, now)
            else:
                m = self._match(req, model)
                cached = m.tokens
                lost = now + m.alone > own  # ttft_lost over its best-cached instance
            if lost:
                # Hopeless even alone and now, on its best-cached instance: best effort, kept.
                self.queue.take(req)
                self._best_effort.append(req)
                continue
            # Its prefill here: the prompt past what this instance has cached, over that.
            k = cached.get(iid, 0)
            c = req.prompt_len - k
            n = used + c
            if n > limit:
                continue
            if len(admitted) >= slots:
                break
            if shares and len(admitted) >= kept and self._at_share(req.tenant, admitted):
                continue
            if m is not None and cached and self.elsewhere(req, iid, m, own, model, now, mixed):
                deferred.add(req.id)
                continue  # a hit elsewhere will start it in time
            # r's prefill is the batch's: every member must keep its TTFT with r joined.
            e_p = self.chunked(model.prefill_time(n, sum_sq + c * (k + c), sum_ck + c * k), n,
                               sh, model, beside)
            if self.calculate_p(min(deadline, own), e_p + beside, sh, wait, now) >= self.theta:
                self.queue.take(req)
                admitted.append((req, False))
                used, deadline = n, min(deadline, own)
                sum_sq, sum_ck = sum_sq + c * (k + c), sum_ck + c * k
        # Best effort only when no feasible request waits: hopeless work must not take the
        # capacity of requests that can still make their SLO ("idle": nor slow one in flight;
        # what the loop adds is hopeless, so asked once).
        may_join = False
        if self._best_effort and not self.queue:
            may_join = self._hopeless_may_join(sh, admitted)
        while may_join and self._best_effort and len(admitted) < slots:
            req = self._best_effort[0]
            c = self._uncached(req, iid)
            if used + c > limit or (shares and len(admitted) >= kept
                                    and self._at_share(req.tenant, admitted)):
                break
            self._best_effort.popleft()
            admitted.append((req, True))
            used += c
        if not admitted and sh.idle and slots > 0:
            # Nothing in flight to protect: take the most urgent request whatever the budget.
            head = next((r for r in self._scan(also)
                         if r.id not in deferred),
                        None)
            if head is not None and head.prompt_len <= sh.free_kv_tokens():
                self.queue.take(head)
                admitted.append((head, False))
            elif self._best_effort and self._best_effort[0].prompt_len <= sh.free_kv_tokens():
                admitted.append((self._best_effort.popleft(), True))
        if not admitted:
            self.maturity.set(iid, now + e_d if e_d > 0 else now)
            return

        sum_len = sum_sq = sum_ck = 0
        for req, best_effort in admitted:
            decision.dispatch.append(Dispatch(req, iid, best_effort=best_effort))
            if best_effort:
                self._hopeless.add(req.id)
            if shares:
                self._taken[req.tenant] = self._taken.get(req.tenant, 0) + 1
            sh.add(req, self.kv_reserve(req), self.guards(req, sh, model))
            k = self.cached(req).get(iid, 0)
            c = req.prompt_len - k
            sum_len += c
            sum_sq += c * (k + c)
            sum_ck += c * k
        e_p = self.chunked(model.prefill_time(sum_len, sum_sq, sum_ck), sum_len, sh, model,
                           beside)
        # The seed's wait counts from now; "admitted" from the end of what was sent before.
        start = max(now, self._prefilled_at.get(iid, now)) if self.wait_admitted and mixed else now
        self._prefilled_at[iid] = start + e_p
        self.maturity.set(iid, self.mature_after(now, start, e_p, sum_len, sh, model, mixed))

    # ---- what the P stage of P/D changes (HFX paper §3.3.1, steps 2 and 4) ---------------------
    def budget(self, sh: ShadowInstance, model: StepTimeModel, e_d: float) -> float:
        """Eq. 5 with the tightest targets involved: queued requests and those in flight (with
        ``guard_tpots`` "keepable", the queued ones whose target the payback can keep)."""
        queued = self.queue.min_tpot()
        if self.guard_keepable and sh.min_tpot() is not None:  # else the next one is kept
            queued = self.queue.min_tpot_from(guard_floor(e_d, self._share))
        return self._eq5(_tighter(self.queue.min_ttft(), sh.min_ttft()),
                         _tighter(queued, sh.min_tpot()), e_d, model)

    def room(self, sh: ShadowInstance, model: StepTimeModel, e_d: float) -> float:
        """Eq. 5 over the instance's own requests only: the prompt tokens a prefill there may
        hold without breaking the tightest TTFT and TPOT in flight (inf when idle)."""
        return self._eq5(sh.min_ttft(), sh.min_tpot(), e_d, model)

    def guards(self, req: Request, sh: ShadowInstance, model: StepTimeModel) -> bool:
        """Whether ``sh`` keeps ``req``'s TPOT once it is sent there (its target counts in
        Eq. 5 and Algorithm 1's payback until it finishes): always, or with ``guard_tpots``
        "keepable" where the payback leaves room for the fleet's prefill demand
        (prefill_demand.py), or where nothing in flight there is kept (the wait still paces
        what Q_R lets go). Decided once, at dispatch: a request kept is kept to its end."""
        if not self.guard_keepable or sh.min_tpot() is None:
            return True
        assert req.slo is not None
        return req.slo.tpot >= guard_floor(self.decode_step(sh, model), self._share)

    def _eq5(self, ttft: float | None, tpot: float | None, e_d: float,
             model: StepTimeModel) -> float:
        """Eq. 5's token budget for these tightest targets; inf without a target or a guard."""
        if self.tpot_guard == "off" or ttft is None or tpot is None:
            return float("inf")
        return token_budget(ttft, self.aim(tpot), e_d, model.prefill_a, model.prefill_b)

    def next_maturity(self, now: float, e_p: float, sh: ShadowInstance,
                      model: StepTimeModel) -> float:
        """After dispatching a batch of prefill time ``e_p`` (Algorithm 1)."""
        if self.tpot_guard == "off":  # no payback: look again once the engine decodes again
            return now + e_p + self.decode_step(sh, model)
        min_tpot = sh.min_tpot()
        assert min_tpot is not None  # called after a dispatch to ``sh``: it keeps one
        return maturity_time(now, e_p, self.decode_step(sh, model), self.aim(min_tpot))

    def aim(self, tpot: float) -> float:
        """The TPOT the guard keeps for a target of ``tpot`` (``tpot_margin``)."""
        margins = self._margins
        return margins.aim(tpot) if margins is not None else tpot * self._fixed_margin

    def mature_after(self, now: float, start: float, e_p: float, tokens: int,
                     sh: ShadowInstance, model: StepTimeModel, mixed: bool) -> float:
        """The next maturity after a batch of ``tokens`` new prompt tokens went to ``sh``, its
        prefill (``e_p``) to start at ``start``. Algorithm 1 (``next_maturity``) waits for the
        batch's prefill to end. With ``prefill_wait`` "admitted", on an engine that admits
        prompts at every step (``mixed``), the wait counts from ``start`` (after what was sent
        there before) and, while requests are left queued, is the same (Q_R orders and admits
        them better than the engine's queue would); with none left it ends when the batch's
        last prefill step starts (of ``chunked``'s steps; the payback is kept): the next
        request to arrive joins the engine's next step after the batch's, as it would if
        held, and is not held meanwhile."""
        if not (self.wait_admitted and mixed):
            return self.next_maturity(now, e_p, sh, model)
        at = self.next_maturity(start, e_p, sh, model)
        if self._queued_here():
            return at
        steps = 1
        if self._step_tokens is not None:
            steps = -(-tokens // max(1, self._step_tokens - sh.batch_size))
        return max(now, at - e_p / steps)

    def kv_reserve(self, request: Request) -> float:
        """Output tokens whose KV the instance will hold for ``request``."""
        return self.predictor.predict(request)

    def _hopeless_may_join(self, sh: ShadowInstance,
                           admitted: list[tuple[Request, bool]]) -> bool:
        """Whether best-effort requests may go to ``sh`` now that no feasible one waits: with
        ``best_effort`` "idle", only where no request that can still meet its SLO is in flight
        or joining (nothing, or best-effort ones only), which they would slow."""
        if not self.best_effort_idle:
            return True
        if not all(best for _, best in admitted) or len(sh.inflight) > len(self._hopeless):
            return False
        return all(r in self._hopeless for r in sh.inflight)

    def _with_parts(self, targets: list[InstanceView], model: StepTimeModel,
                    now: float) -> bool:
        """Size the tier parts (tier_parts.py) if due, moving the queue between this
        dispatcher and theirs as they start or stop; whether they are on."""
        tiers = self._tiers
        assert tiers is not None
        change = tiers.update(tiers.ids_of(targets), model, now)
        if change is Change.STARTED:
            here = self.queue.requests() + list(self._best_effort)
            for req in sorted(here, key=_by_arrival):
                self.withdraw_here(req.id)
                tiers.route(req, now)
        elif change is Change.STOPPED:
            for req in tiers.drain():
                self._queue_here(req, now)
        return tiers.active

    def withdraw_here(self, request_id: str) -> bool:
        """Drop a request from this dispatcher's own queues (not its parts')."""
        if self.queue.remove(request_id):
            return True
        for req in self._best_effort:
            if req.id == request_id:
                self._best_effort.remove(req)
                return True
        return False

    def on_instance_removed(self, instance_id: int) -> None:
        if self._tiers is not None:
            self._tiers.removed(instance_id)

    def on_finished(self, record: RequestRecord, view: ClusterView) -> None:
        tiers = self._tiers
        if tiers is not None:
            tiers.observe(record)
            holder = tiers.holder(record.instance)
            if holder is not None:
                holder.on_finished(record, view)
                return
        self._hopeless.discard(record.request.id)
        margins, slo = self._margins, record.slo
        if margins is not None and record.outcome is Outcome.FINISHED and slo is not None \
                and slo.tpot:
            measured = record.tpot
            if measured is not None:
                margins.observe(slo.tpot, measured)
        sh = self.shadow.finished(record, record.instance, self.predictor)
        if sh is not None and sh.idle:
            self.maturity.set(sh.id, min(self.maturity[sh.id], view.now))
