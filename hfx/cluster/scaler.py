"""The Scaler: SLO-aware autoscaling (HyperFlexis §6, Algorithm 3; HFX paper §3.3.3).

Every τ seconds (1 s, HyperFlexis §9.3) it computes, per pool (the whole fleet when colocated; the
prefill and the decode pool separately in P/D):

1. ρ = R_in / R_out over a fixed 10 s window of the pool's queue: enqueue and dequeue
   timestamps (HFX paper §3.3.3). The queue is the global request queue for a colocated or
   prefill pool (dequeue = dispatch) and the Migrator's for a decode pool (dequeue = migration
   start). Suppressed (None) until the window holds ``min_samples`` events. ρ > 1: the queue
   grows. (Counting request *completions* instead reads every startup as overload: completions
   trail arrivals by a request's lifetime while the fleet fills.)
2. W = mean over queued requests of wait / SLO: for a colocated or prefill pool, requests still
   without a first token, relative to their TTFT SLO; for a decode pool, prefilled requests not
   yet migrated, relative to their TPOT SLO. By default (ours) the mean is taken per SLO class
   (SLOs within a factor of two) and W is the largest: the seed's one mean over the queue let
   loose requests hide a tight class that missed (``wait_indicator``).
3. u_k = (KV blocks held + blocks reserved by its waiting requests) / total, per instance.

Scale out when ρ > ε_o or W > w_max. Scale in — draining the instance with the smallest u_k —
when W ≤ w_max and either the arrival rate has fallen below ε_i times the rate at which the pool
last grew while its queue is not growing (ρ ≤ 1), or, with no growth to undo, ρ < ε_i (the seed's
rule; in P/D it lets a pool give an instance to the other). Why not ρ < ε_i alone: ρ is a queue
ratio, ≈ 1 at any steady load however many instances serve it and < 1 while a new instance clears
a backlog, so alone it flapped the fleet in and out during a burst and never shrank it after;
HyperFlexis §6 asks for low load "for a sustained period".

The seed's numeric defaults were lost in its text; ours: ε_o = 1.1 and ε_i = 0.9, about twice
the ±5% noise of ρ over a 10 s window holding 400–1,200 events (with ε_o = 1.2 a sustained 10%
excess, a burst to 120 QPS on a fleet dispatching 106/s, went unanswered for 30 s while 400
requests queued); w_max = 0.5 (queued requests have used half their SLO on average); a 2 s
cool-down after each action, while instances still loading count as capacity.
docs/results.md shows the interval ablation.

In P/D, when one pool wants to shrink while the other grows, a drained instance switches role
instead of stopping one and starting another; the TLManager links it to the other pool before it
serves. Scale-in drains: the instance takes no new work, finishes (or, prefill, migrates) what it
holds, then stops; nothing in flight is lost.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from hfx.cluster.instance import Instance
from hfx.cluster.provisioner import Plan, Provisioner
from hfx.engine import Role
from hfx.engine.stats import InstanceStats


@dataclass(frozen=True, slots=True)
class ScalerConfig:
    min_instances: int
    max_instances: int
    interval: float = 1.0  # τ, HyperFlexis §9.3
    window: float = 10.0  # HFX paper §3.3.3
    min_samples: int = 20  # events in the window before ρ is trusted
    scale_out_ratio: float = 1.1  # ε_o (ours)
    scale_in_ratio: float = 0.9  # ε_i (ours)
    wait_threshold: float = 0.5  # W above which to scale out (ours)
    wait_per_class: bool = True  # W per SLO class, the largest (ours); False: the seed's mean
    cooldown: float = 2.0  # seconds between actions (ours)
    role_switch_time: float = 1.0  # a drained instance serving in its new role (ours)

    def __post_init__(self) -> None:
        if not 1 <= self.min_instances <= self.max_instances:
            raise ValueError(f"need 1 <= min_instances ({self.min_instances}) <= "
                             f"max_instances ({self.max_instances})")
        if self.interval <= 0 or self.window <= 0:
            raise ValueError("interval and window must be positive")
        if not 0 < self.scale_in_ratio < self.scale_out_ratio:
            raise ValueError("need 0 < scale_in_ratio < scale_out_ratio")


class RateWindow:
    """Enqueue and dequeue timestamps of a queue over the last ``window`` seconds."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.enqueued: deque[float] = deque()
        self.dequeued: deque[float] = deque()

    def enqueue(self, t: float) -> None:
        self.enqueued.append(t)

    def dequeue(self, t: float) -> None:
        self.dequeued.append(t)

    def ratio(self, now: float, min_samples: int) -> float | None:
        """ρ = R_in / R_out over the window; None until it holds ``min_samples`` events. A queue
        that enqueues and never dequeues is infinitely overloaded."""
        horizon = now - self.window
        for q in (self.enqueued, self.dequeued):
            while q and q[0] < horizon:
                q.popleft()
        n_in, n_out = len(self.enqueued), len(self.dequeued)
        if n_in + n_out < min_samples:
            return None
        return float("inf") if n_out == 0 else n_in / n_out

    def arrival_rate(self) -> float:
        """Enqueues per second over the window (as of the last ``ratio`` call)."""
        return len(self.enqueued) / self.window


def wait_indicator(now: float, waiting: Iterable[tuple[float, float]],
                   per_class: bool = False) -> float:
    """W: mean over queued requests of (time waited) / (its SLO); 0 with nothing queued.

    ``per_class`` (ours): the largest such mean over SLO classes, a class being the SLOs within
    a factor of two (one power-of-two bin, so a priority's mapped SLOs, ±25% of its nominal,
    stay together). The seed's single mean lets a queue of loose requests hide a tight class
    that is missing its SLO: P/D four-task at 200 QPS (docs/results.md) held W at 0.2-0.5
    while medical_qa (TTFT 0.7 s) attained 0.32, its own mean at 0.47-0.66.
    """
    classes: dict[int, list[float]] = {}  # class → [Σ wait / SLO, count]; the seed's: one
    for since, slo in waiting:
        acc = classes.setdefault(math.floor(math.log2(slo)) if per_class else 0, [0.0, 0])
        acc[0] += (now - since) / slo
        acc[1] += 1
    return max((total / n for total, n in classes.values()), default=0.0)


def kv_utilisation(stats: InstanceStats) -> float:
    """u_k: blocks held plus blocks its waiting requests will need, over its total."""
    return (stats.kv_used_blocks + stats.kv_waiting_blocks) / stats.kv_total_blocks


@dataclass(slots=True)
class ScaleEvent:
    time: float
    action: str  # scale_out, scale_in, ready, released, switch_role
    role: str
    reason: str
    instance: int


@dataclass(slots=True)
class _Pool:
    role: Role
    rates: RateWindow
    minimum: int
    # Arrival rates at which this pool grew, most recent last; a scale-in undoes the latest.
    grew_at: list[float] = field(default_factory=list)


@dataclass(slots=True)
class ScalerState:
    events: list[ScaleEvent] = field(default_factory=list)
    over_time: list[dict] = field(default_factory=list)
    max_used: int = 0


# Brings up instance ``id`` in ``role`` as the provisioner planned it: a simulated instance
# waits out the plan's modelled seconds; a real one loads its weights by the plan's path.
Launcher = Callable[[int, Role, Plan], Awaitable[Instance]]


class FleetControl(Protocol):
    """What the Scaler reads and does; hfx.cluster.control.ControlPlane provides it."""

    @property
    def pd(self) -> bool: ...

    def roles(self) -> dict[int, Role]:
        """Every instance holding a device (serving or draining) and its role."""
        ...

    def accepting(self, instance_id: int) -> bool: ...

    def stats(self, instance_id: int) -> InstanceStats: ...

    def waiting(self, role: Role) -> Iterable[tuple[float, float]]:
        """(waiting since, SLO) of each request queued for this pool."""
        ...

    def drain(self, instance_id: int) -> None: ...

    def release(self, instance_id: int) -> None: ...

    def switch_role(self, instance_id: int, role: Role, ready_at: float) -> None: ...

    def add_instance(self, instance: Instance, provisioned_at: float) -> None: ...

    def record_span(self, instance_id: int, since: float, until: float) -> None: ...

    def launch_failed(self, instance_id: int, error: str) -> None: ...


class Scaler:
    """Watches the fleet's queues and grows or shrinks the fleet (the control plane's
    ``ScalerHooks``: attach it with ``ControlPlane.attach_scaler``)."""

    def __init__(self, config: ScalerConfig, control: FleetControl, provisioner: Provisioner,
                 factory: Launcher, describe: Callable[[Plan], str] = Plan.describe) -> None:
        self.config = config
        self.control = control
        self.provisioner = provisioner
        self.factory = factory
        self.describe = describe  # how the placement will bring a planned launch up
        self.state = ScalerState()
        if control.pd:
            # Each pool keeps at least one instance; together at least min_instances.
            self.pools = {r: _Pool(r, RateWindow(config.window), 1) for r in
                          (Role.PREFILL, Role.DECODE)}
        else:
            self.pools = {Role.COLOCATED: _Pool(Role.COLOCATED, RateWindow(config.window),
                                                config.min_instances)}
        self._provisioning: dict[int, tuple[Role, float]] = {}  # role, provisioned at
        self._switching: dict[int, Role] = {}  # draining to change role
        self._last_action = float("-inf")
        self._next_id = max(control.roles()) + 1
        self._task: asyncio.Task[None] | None = None
        self._launches: set[asyncio.Task[None]] = set()

    # ---- events from the control plane -----------------------------------------------------
    def on_enqueue(self, role: Role, t: float) -> None:
        self.pools[role].rates.enqueue(t)

    def on_dequeue(self, role: Role, t: float) -> None:
        self.pools[role].rates.dequeue(t)

    def on_drained(self, iid: int) -> None:
        now = asyncio.get_running_loop().time()
        new_role = self._switching.pop(iid, None)
        if new_role is not None:
            self.control.switch_role(iid, new_role, now + self.config.role_switch_time)
            self._event(now, "switch_role", new_role, "drained", iid)
        else:
            role = self.control.roles()[iid]
            self.control.release(iid)
            self.provisioner.give_back()
            self._event(now, "released", role, "drained", iid)

    def on_failed(self, iid: int, role: Role) -> None:
        """An instance broke: replace it now, without waiting for the indicators or
        the cool-down; the failed one was released when it drained."""
        now = asyncio.get_running_loop().time()
        self._event(now, "failed", role, "instance failed", iid)
        self.scale_out_now(role, f"replace failed instance {iid}")

    def launching(self, role: Role | None = None) -> int:
        """Instances being started (loading weights) now, in ``role`` if given."""
        if role is None:
            return len(self._provisioning)
        return sum(r is role for r, _ in self._provisioning.values())

    def scale_out_now(self, role: Role, reason: str = "asked") -> int | None:
        """Start one more instance in ``role`` now, outside the indicators and the cool-down
        (an operator's request, a benchmark); returns its id, or None at ``max_instances``."""
        if self._occupied() >= self.config.max_instances:
            return None
        iid = self._next_id
        self._scale_out(role, asyncio.get_running_loop().time(), reason)
        return iid

    # ---- the loop ---------------------------------------------------------------------------
    def start(self) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(self.config.interval)
                self.tick(asyncio.get_running_loop().time())

        self._sample(asyncio.get_running_loop().time())
        self._task = asyncio.get_running_loop().create_task(loop(), name="scaler")

    def stop(self) -> None:
        """Stop deciding; instances still loading are released now (their cost counted)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for task in self._launches:
            task.cancel()
        now = asyncio.get_running_loop().time()
        for iid, (_, since) in self._provisioning.items():
            self.control.record_span(iid, since, now)
        self._provisioning.clear()

    def _members(self, role: Role) -> list[int]:
        return [i for i, r in self.control.roles().items()
                if r is role and self.control.accepting(i)]

    def _occupied(self) -> int:
        """Devices in use: serving, draining, switching role, or loading (the max bound)."""
        return len(self.control.roles()) + len(self._provisioning)

    def _serving(self) -> int:
        """Capacity that stays: accepting instances and those loading (the min bound)."""
        return sum(len(self._members(r)) for r in self.pools) + len(self._provisioning)

    def indicators(self, role: Role, now: float) -> tuple[float | None, float]:
        pool = self.pools[role]
        rho = pool.rates.ratio(now, self.config.min_samples)
        return rho, wait_indicator(now, self.control.waiting(role), self.config.wait_per_class)

    def tick(self, now: float) -> None:
        cfg = self.config
        wants: dict[Role, str | None] = {}
        reasons: dict[Role, str] = {}
        for role in self.pools:
            rho, w = self.indicators(role, now)
            pool = self.pools[role]
            if (rho is not None and rho > cfg.scale_out_ratio) or w > cfg.wait_threshold:
                wants[role] = "out"
            elif rho is not None and w <= cfg.wait_threshold and (
                    # Undo the latest growth once the load behind it has receded...
                    (pool.grew_at and rho <= 1.0 and pool.rates.arrival_rate()
                     < cfg.scale_in_ratio * pool.grew_at[-1])
                    # ...or, with nothing to undo, the seed's rule.
                    or (not pool.grew_at and rho < cfg.scale_in_ratio)):
                wants[role] = "in"
            else:
                wants[role] = None
            reasons[role] = f"rho={'-' if rho is None else f'{rho:.2f}'} W={w:.2f}"
        if now - self._last_action >= cfg.cooldown:
            self._act(now, wants, reasons)
        self._sample(now)

    def _act(self, now: float, wants: dict[Role, str | None], reasons: dict[Role, str]) -> None:
        cfg = self.config
        growing = [r for r, w in wants.items() if w == "out"]
        shrinking = [r for r, w in wants.items() if w == "in"
                     and len(self._members(r)) > self.pools[r].minimum]
        if growing and shrinking and self.control.pd:
            # One pool shrinks while the other grows: move an instance across.
            src, dst = shrinking[0], growing[0]
            iid = self._least_utilised(src)
            self._switching[iid] = dst
            self._shrunk(src)
            self.pools[dst].grew_at.append(self.pools[dst].rates.arrival_rate())
            self._event(now, "scale_in", src, f"switch to {dst.value}: {reasons[src]}", iid)
            self._last_action = now
            self.control.drain(iid)
        elif growing and self._occupied() < cfg.max_instances:
            self._scale_out(growing[0], now, reasons[growing[0]])
        elif shrinking and self._serving() > cfg.min_instances:
            role = shrinking[0]
            iid = self._least_utilised(role)
            self._shrunk(role)
            self._event(now, "scale_in", role, reasons[role], iid)
            self._last_action = now
            self.control.drain(iid)

    def _shrunk(self, role: Role) -> None:
        if self.pools[role].grew_at:
            self.pools[role].grew_at.pop()

    def _least_utilised(self, role: Role) -> int:
        stats = {i: self.control.stats(i) for i in self._members(role)}
        return min(stats, key=lambda i: (kv_utilisation(stats[i]), -i))

    def _scale_out(self, role: Role, now: float, reason: str) -> None:
        iid = self._next_id
        self._next_id += 1
        plan = self.provisioner.plan(peers_running=len(self.control.roles()))
        self._provisioning[iid] = (role, now)
        self.pools[role].grew_at.append(self.pools[role].rates.arrival_rate())
        self._last_action = now
        detail = f"{reason}; {self.describe(plan)}"
        self._event(now, "scale_out", role, detail, iid)
        task = asyncio.get_running_loop().create_task(self._launch(iid, role, now, plan))
        self._launches.add(task)
        task.add_done_callback(self._launches.discard)

    async def _launch(self, iid: int, role: Role, provisioned_at: float, plan: Plan) -> None:
        try:
            instance = await self.factory(iid, role, plan)
        except Exception as e:  # a launch that fails frees its slot; the indicators decide again
            self._provisioning.pop(iid, None)
            self.provisioner.give_back()
            self._event(asyncio.get_running_loop().time(), "launch_failed", role,
                        f"{type(e).__name__}: {e}", iid)
            self.control.launch_failed(iid, f"{type(e).__name__}: {e}")
            return
        if self._provisioning.pop(iid, None) is None:
            await instance.stop()  # the run ended while it loaded
            return
        self.control.add_instance(instance, provisioned_at)
        self._event(asyncio.get_running_loop().time(), "ready", role, "weights loaded", iid)

    def _event(self, now: float, action: str, role: Role, reason: str, iid: int) -> None:
        self.state.events.append(ScaleEvent(now, action, role.value, reason, iid))

    def _sample(self, now: float) -> None:
        by_role = {r.value: len(self._members(r)) for r in self.pools}
        active = len(self.control.roles())  # cost-bearing: serving or draining
        self.state.max_used = max(self.state.max_used, active + len(self._provisioning))
        self.state.over_time.append({
            "time": now, "active": active, "provisioning": len(self._provisioning),
            "draining": active - sum(by_role.values()), **by_role,
            "queued": sum(1 for r in self.pools for _ in self.control.waiting(r)),
        })
