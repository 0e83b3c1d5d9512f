# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``slos-serve``: SLOs-Serve (SLOs-Serve) as a policy: soft admission control by dynamic
programming, SLO-driven routing, and a best-effort tier.

Admission (§3.2.1, the request-throughput form of Appendix C). For one replica, candidates and
the replica's outstanding prefill work — requests admitted since its last Monitor snapshot, and
of the earlier ones the latest-deadline prompts that make up the snapshot's waiting tokens (its
engine prefills earliest deadline first) — are taken in
prefill-deadline order (pDDL = arrival + TTFT). ``pb[n]`` is the largest prefill budget left at
the current deadline having accepted n candidates; between deadlines the replica generates
Δpb = Δt · rate(D) prefill tokens, where D = Σ 1/TPOT is the decode demand of everything it
serves and rate(D) is what the step-time model leaves for prefill once decodes are paced at
their SLO (§3.2.2). Accepting request i costs its prompt p_i and adds 1/TPOT_i to D; it is
feasible only if the budget stays ≥ 0 and the KV of all accepted requests fits. Already-admitted
requests are forced in (continuous optimisation). The DP keeps, for every n, the state with the
most budget (then the least demand): the per-tier counts of the seed's state are folded into D,
exact when requests share a TPOT, O(N²) in general. The largest feasible n is admitted.

Subset selection (§3.1, Algorithm 1): the scheduler runs between batches, so the requests that
arrive during one are decided together: a replica's DP takes all of its candidates at once and
admits the largest set it can serve. Here a new request waits up to ``decide_steps`` decode
steps (Eq. 2's fixed term) for others to be decided with; 0 decides each on arrival.

Routing (§4.2): a new request goes to the next replica round robin; declined, it tries the next
replica, up to ``route_limit`` replicas. Declined everywhere, it joins the best-effort tier
(§4.1) on the replica with the most free KV: served with leftover budget, preempted first.

Batch formation (Algorithm 2) runs inside each replica: the ``slo-paced`` planner.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import cast

from hfx.engine.planners.slo_paced import DEFAULT_PACE, SLOPacedPlanner, time2bs
from hfx.policies.base import ArrivalOrderPolicy, ClusterView, Decision, Dispatch, InstanceView
from hfx.policies.output_length import OutputLengthPredictor
from hfx.policies.shadow import ShadowInstance, Shadows
from hfx.request import Request, RequestRecord
from hfx.stepmodel.latency import StepTimeModel

# The keys a DP state accepted: the last one and the chain before it, itself an Accepted
# (None: none). Typed loosely: mypyc does not compile a recursive alias.
Accepted = tuple[str, object] | None


@dataclass(frozen=True, slots=True)
class Item:
    """A request as the admission DP sees it."""

    key: str
    deadline: float  # pDDL: arrival + TTFT
    prompt: int
    demand: float  # 1 / TPOT, decode tokens per second once it decodes
    memory: float  # KV tokens: prompt + predicted output
    forced: bool = False  # already admitted


def prefill_rate(model: StepTimeModel, demand: float, t0: float, ctx_per_seq: float) -> float:
    """Prefill tokens per second a replica has left when its decodes need ``demand``
    tokens/s, paced in steps of ``t0`` seconds (time2bs over one step, per second)."""
    decodes = demand * t0
    return time2bs(model, t0, decodes * ctx_per_seq, round(decodes)) / t0


def admit(items: list[Item], now: float, model: StepTimeModel, t0: float, demand0: float,
          memory_free: float, ctx_per_seq: float) -> list[str]:
    """The largest set of candidates the replica can serve within every SLO (keys)."""
    # n → (budget, demand, memory used, accepted keys). The keys are a chain of (key, the
    # keys before) shared between states: extending one copies nothing (a tuple per state
    # was a copy of every key accepted so far, per item and state).
    State = tuple[float, float, float, Accepted]
    states: dict[int, State] = {0: (0.0, demand0, 0.0, None)}
    # A state's demand is one of few sums (forced work adds none): each rate computed once.
    rates: dict[float, float] = {}
    # Past the last candidate, forced work lowers every state's budget but changes no state's
    # count or keys, so the answer is known there.
    undecided = sum(1 for x in items if not x.forced)
    t = now
    for item in sorted(items, key=lambda x: (x.deadline, x.key)):
        if not undecided:
            break
        dt = max(0.0, item.deadline - t)
        t = max(t, item.deadline)
        grown: dict[int, State] = {}
        for n, (pb, d, m, acc) in states.items():
            rate = rates.get(d)
            if rate is None:
                rate = rates[d] = prefill_rate(model, d, t0, ctx_per_seq)
            grown[n] = (pb + dt * rate, d, m, acc)
        if item.forced:  # in every state, no choice (most items are forced work)
            states = {n: (pb - item.prompt, d + item.demand, m, acc)
                      for n, (pb, d, m, acc) in grown.items()}
            continue
        nxt: dict[int, State] = {}

        def keep(n: int, state: State, nxt: dict[int, State] = nxt) -> None:
            best = nxt.get(n)
            if best is None or (state[0], -state[1]) > (best[0], -best[1]):
                nxt[n] = state

        for n, (pb, d, m, acc) in grown.items():
            keep(n, (pb, d, m, acc))  # decline
            pb_in, m_in = pb - item.prompt, m + item.memory
            if pb_in >= 0 and m_in <= memory_free:
                keep(n + 1, (pb_in, d + item.demand, m_in, (item.key, acc)))
        states = nxt
        undecided -= 1
    keys: list[str] = []
    chain = states[max(states)][3]
    while chain is not None:
        keys.append(chain[0])
        chain = cast(Accepted, chain[1])
    keys.reverse()  # in the order they were accepted
    return keys


class SLOsServe(ArrivalOrderPolicy):
    name = "slos-serve"
    planner = SLOPacedPlanner.name

    def __init__(self, route_limit: int = 2, output_length: str = "history",
                 pace: float = DEFAULT_PACE, decide_steps: float = 1.0) -> None:
        if route_limit < 1:
            raise ValueError(f"route_limit must be >= 1, got {route_limit}")
        if not 0 < pace <= 1:
            raise ValueError(f"pace must be in (0, 1], got {pace}")
        if decide_steps < 0:
            raise ValueError(f"decide_steps must be >= 0, got {decide_steps}")
        self.route_limit = int(route_limit)
        self.decide_steps = float(decide_steps)
        # The engine's decode pace (``--planner-params pace=``) as admission plans with it:
        # give both the same value.
        self.pace = float(pace)
        self.predictor = OutputLengthPredictor(output_length)
        self.shadow = Shadows()
        super().__init__()
        self._next = 0
        # Requests admitted to each replica and not finished: id → (admitted at, its item as
        # forced work: its decode demand is in the shadow's, its admission number).
        self._admitted: dict[int, dict[str, tuple[float, Item, int]]] = {}
        # The same by deadline: (deadline, −admission number, id), ascending, so that from the
        # end the latest deadlines come first and equal ones in admission order (``_admit``
        # reads them every decision; sorting every admitted request each time cost most of a
        # 16-instance run).
        self._by_deadline: dict[int, list[tuple[float, int, str]]] = {}
        self._admissions = 0

    def _item(self, req: Request, forced: bool = False) -> Item:
        """``req`` as a candidate, or as forced work: its prompt still to prefill, its decode
        demand and memory already counted (in the shadow)."""
        assert req.slo is not None
        if forced:
            return Item(req.id, req.arrival + req.slo.ttft, req.prompt_len, 0.0, 0.0, True)
        return Item(req.id, req.arrival + req.slo.ttft, req.prompt_len, 1.0 / req.slo.tpot,
                    req.prompt_len + self.predictor.predict(req))

    def _admit(self, inst: InstanceView, sh: ShadowInstance, reqs: list[Request],
               model: StepTimeModel, now: float) -> set[str]:
        """Run the replica's admission DP over the candidates ``reqs``: the ids it admits."""
        # Forced work (continuous optimisation): prompts not yet prefilled. Those admitted since
        # the last snapshot, and of the earlier ones the latest-deadline prompts that make up the
        # snapshot's waiting tokens (the engine prefills earliest deadline first). Their decode
        # demand is already in demand0 (they are in the shadow).
        since = inst.stats.time
        admitted = self._admitted.setdefault(inst.id, {})
        # In admission order (``schedule`` re-inserts on admission): those since the snapshot
        # are the newest, found without a pass over every request admitted.
        pending: list[Item] = []
        for t, x, _ in reversed(admitted.values()):
            if t < since:
                break
            pending.append(x)
        left = inst.stats.kv_waiting_blocks * inst.stats.block_size
        if left > 0:
            for _, _, key in reversed(self._by_deadline.get(inst.id, [])):
                t, x, _ = admitted[key]
                if t >= since:
                    continue  # counted above
                if left <= 0:
                    break
                pending.append(x)
                left -= x.prompt
        demand0 = sh.tpot_demand()
        # The tightest TPOT, running or candidate, sets the step every batch is planned at.
        tightest = min(r.slo.tpot for r in reqs if r.slo is not None)
        t0 = self.pace * min(sh.min_tpot() or tightest, tightest)
        ctx = (sh.decode_ctx / sh.batch_size if sh.batch_size
               else sum(r.prompt_len for r in reqs) / len(reqs))
        return set(admit([*pending, *(self._item(r) for r in reqs)], now, model, t0, demand0,
                         sh.free_kv_tokens(), ctx))

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        now, model = view.now, view.step_model
        targets = view.accepting()
        if not targets or not self._queue:
            return decision
        # Algorithm 1 runs between batches: wait up to a batch for others to decide with.
        due = self._queue[0].arrival + self.decide_steps * model.decode_a
        if now < due:
            decision.wake_at = due
            return decision
        shadows = {inst.id: self.shadow.sync(inst) for inst in targets}
        # Each request's first replica round robin; declined there, the next (§4.2).
        undecided: list[tuple[Request, int]] = []
        while self._queue:
            undecided.append((self._queue.popleft(), self._next % len(targets)))
            self._next += 1
        for hop in range(min(self.route_limit, len(targets))):
            candidates: dict[int, list[Request]] = {}
            for req, start in undecided:
                candidates.setdefault((start + hop) % len(targets), []).append(req)
            admitted_ids: set[str] = set()
            for k, reqs in candidates.items():
                inst = targets[k]
                sh = shadows[inst.id]
                ids = self._admit(inst, sh, reqs, model, now)
                for req in reqs:
                    if req.id in ids:
                        decision.dispatch.append(Dispatch(req, inst.id))
                        sh.add(req, self.predictor.predict(req))
                        self._record(inst.id, req, now)
                admitted_ids |= ids
            undecided = [(r, s) for r, s in undecided if r.id not in admitted_ids]
        if undecided:  # the best-effort tier (§4.1), to the replica with the most free KV
            # Not in the shadow: best-effort work yields to SLO work (preempted first) and
            # must not tighten the replica's admission of SLO requests; so one replica takes
            # them all, found once.
            inst = max(targets, key=lambda i: (shadows[i.id].free_kv_tokens(), -i.id))
            for req, _ in undecided:
                decision.dispatch.append(Dispatch(req, inst.id, best_effort=True))
        return decision

    def _record(self, iid: int, req: Request, now: float) -> None:
        """``req`` admitted to replica ``iid`` at ``now``: forced work from here on."""
        self._forget(iid, req.id)  # keep the dict in admission order
        item = self._item(req, forced=True)
        self._admissions += 1
        self._admitted.setdefault(iid, {})[req.id] = (now, item, self._admissions)
        bisect.insort(self._by_deadline.setdefault(iid, []),
                      (item.deadline, -self._admissions, req.id))

    def _forget(self, iid: int, rid: str) -> None:
        kept = self._admitted.get(iid, {}).pop(rid, None)
        if kept is None:
            return
        _, item, number = kept
        by_deadline = self._by_deadline[iid]
        i = bisect.bisect_left(by_deadline, (item.deadline, -number))
        assert by_deadline[i][2] == rid
        del by_deadline[i]

    def on_finished(self, record: RequestRecord, view: ClusterView) -> None:
        self.shadow.finished(record, record.instance, self.predictor)
        if record.instance is not None:  # else it was admitted nowhere
            self._forget(record.instance, record.request.id)
