# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The request ledger: each request's record from arrival to outcome, and who hears its tokens.

The ledger owns the records (dispatch, every token time, finish, outcome), the token listeners
the gateway streams from, and the set of requests still waiting for their first token, with a
count per priority: HFX-PM's contention rule and the Scaler's W indicator read it. It makes no
decisions; the control plane tells it what happened.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hfx.engine.core import StepOutput
from hfx.engine.executor import PLACEHOLDER_TOKEN
from hfx.request import Outcome, Request, RequestRecord, TokenRun


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """What a listener hears about one request: a sampled token (PLACEHOLDER_TOKEN from a
    simulated executor), or the end (token None)."""

    token: int | None
    finish_reason: str | None = None  # "stop", "length", "abort", or "error" with ``error``
    error: str | None = None


Listener = Callable[[TokenEvent], None]


class RequestLedger:
    def __init__(self, priority_levels: int = 0) -> None:
        self.records: dict[str, RequestRecord] = {}
        self.num_done = 0  # records with a terminal outcome
        self._opened = 0  # records opened so far (RequestRecord.seq)
        # Told of each record once everything its end causes is done (a simulation that folds
        # finished records into its metrics and forgets them: hfx/sim/driver.py).
        self.on_done: Callable[[RequestRecord], None] | None = None
        self._listeners: dict[str, Listener] = {}  # hear every token and the end
        self._enders: dict[str, Listener] = {}  # hear the end only
        # Requests without a first token, tracked for those who read them (see await_first).
        self._awaiting: dict[str, RequestRecord] = {}
        self._awaiting_count = [0] * priority_levels
        self._counted: dict[str, int] = {}  # request id → the priority it is counted under
        self._idle = asyncio.Event()
        self._idle.set()
        # Per instance, the time of each step of its decode cohort (StepOutput.ticked): the
        # members' token times, by reference (RequestRecord.runs).
        self._ticks: dict[int, array] = {}
        # Per instance, the cohort members with a listener: they hear each tick.
        self._tick_listeners: dict[int, dict[str, Listener]] = {}

    # ---- arrival -----------------------------------------------------------------------------
    def open(self, request: Request, listener: Listener | None,
             token_events: bool = True) -> RequestRecord:
        """``token_events`` False: the listener hears only the end (it has the tokens
        already: a front process that reads them from vLLM)."""
        if request.id in self.records:
            raise ValueError(f"duplicate request id {request.id!r}")
        record = self.records[request.id] = RequestRecord(request, seq=self._opened)
        self._opened += 1
        if listener is not None:
            (self._listeners if token_events else self._enders)[request.id] = listener
        self._idle.clear()
        return record

    def await_first(self, record: RequestRecord, priority: int | None = None) -> None:
        """Track ``record`` until its first token; counted under ``priority`` if given."""
        self._awaiting[record.request.id] = record
        if priority is not None and record.request.id not in self._counted:
            self._awaiting_count[priority] += 1
            self._counted[record.request.id] = priority

    def higher_pending(self, priority: int) -> bool:
        """Whether a request more important than ``priority`` still awaits its first token."""
        return any(self._awaiting_count[:priority])

    def awaiting(self) -> Iterator[tuple[float, float]]:
        """(arrival, TTFT SLO) of every tracked request without a first token."""
        for record in self._awaiting.values():
            assert record.slo is not None
            yield record.request.arrival, record.slo.ttft

    # ---- tokens ------------------------------------------------------------------------------
    def on_tokens(self, out: StepOutput, instance_id: int = 0) -> None:
        """One step's tokens: their times, the ids a real executor sampled (what a retry resumes
        from), the listeners, first tokens."""
        records = self.records
        if out.cached:
            for rid, n in out.cached:
                record = records.get(rid)
                if record is not None:
                    record.cached_tokens = n
        moves = out.moves
        if out.ticked:
            moves = self._on_ticks(out, instance_id, moves)
        if out.token_times is None:
            now = out.time
            for rid in out.request_ids:
                records[rid].token_times.append(now)
        else:
            for rid, t in zip(out.request_ids, out.token_times, strict=True):
                records[rid].token_times.append(t)
        if out.token_ids is not None:
            for rid, token in zip(out.request_ids, out.token_ids, strict=True):
                record = records[rid]
                if record.output_ids is None:
                    record.output_ids = []
                record.output_ids.append(token)
        if self._listeners:
            tokens = out.token_ids or [PLACEHOLDER_TOKEN] * len(out.request_ids)
            for rid, token in zip(out.request_ids, tokens, strict=True):
                listener = self._listeners.get(rid)
                if listener is not None:
                    listener(TokenEvent(token))
        if self._awaiting:
            # The few first tokens of the step, found at C speed, not by a call per token.
            for rid in self._awaiting.keys() & out.request_ids:
                self._first_token(rid)
        if moves:  # after the step's own tokens: a run opened now comes after them
            for rid, tick, joined in moves:
                self._move(rid, tick, joined, instance_id)

    # A simulated engine's decode cohort: one time per step in the instance's tick log; a run
    # opened or closed on a record as its request joins or leaves (tick numbers index the log:
    # tick k's time is ``log[k - 1]``).
    def _log(self, instance_id: int) -> array:
        log = self._ticks.get(instance_id)
        if log is None:
            log = self._ticks[instance_id] = array("d")
        return log

    def _on_ticks(self, out: StepOutput, instance_id: int,
                  moves: list[tuple[str, int, bool]] | None
                  ) -> list[tuple[str, int, bool]] | None:
        """The cohort's ticks in this output (a decode run's earlier ones, then ``out.time``);
        returns the moves left for after the step's own tokens. Records index the log, so
        without listeners the order is free; with them, the moves before each tick are applied
        before it, so that a member hears exactly the ticks between its join and its leave."""
        log = self._log(instance_id)
        if not self._listeners:
            if out.earlier_ticks:
                log.extend(out.earlier_ticks)
            log.append(out.time)
            return moves
        pending = moves or []
        i = 0
        for t in [*(out.earlier_ticks or ()), out.time]:
            k = len(log) + 1  # this tick's number
            while i < len(pending) and pending[i][1] < k:
                rid, tick, joined = pending[i]
                self._move(rid, tick, joined, instance_id)
                i += 1
            log.append(t)
            listeners = self._tick_listeners.get(instance_id)
            if listeners:
                for listener in list(listeners.values()):
                    listener(TokenEvent(PLACEHOLDER_TOKEN))
        return pending[i:]

    def _move(self, rid: str, tick: int, joined: bool, instance_id: int) -> None:
        record = self.records.get(rid)
        if record is None or record.outcome is not Outcome.PENDING:
            return  # forgotten, or ended (its runs are closed)
        runs = record.runs
        listeners = self._tick_listeners.get(instance_id)
        if not joined:
            if runs and runs[-1].end is None:
                runs[-1].end = tick
            if listeners:
                listeners.pop(rid, None)
            return
        run = TokenRun(len(record.token_times), self._log(instance_id), tick)
        if runs is None:
            record.runs = [run]
        else:
            runs.append(run)
        listener = self._listeners.get(rid)
        if listener is not None:
            if listeners is None:
                listeners = self._tick_listeners[instance_id] = {}
            listeners[rid] = listener

    def _first_token(self, request_id: str) -> None:
        if self._awaiting.pop(request_id, None) is not None:
            priority = self._counted.pop(request_id, None)
            if priority is not None:
                self._awaiting_count[priority] -= 1

    # ---- the end -----------------------------------------------------------------------------
    def settle(self, record: RequestRecord, outcome: Outcome, now: float,
               error: str | None = None) -> None:
        """Give ``record`` its terminal outcome."""
        record.outcome = outcome
        record.finish_time = now
        record.error = error
        record.close_runs()
        self.num_done += 1
        if self._awaiting:
            self._first_token(record.request.id)

    def announce(self, record: RequestRecord, reason: str | None) -> None:
        """After ``settle`` and whatever else the end of a request causes: wake ``wait_idle``,
        then tell its listener (last: a listener may ``forget`` the record)."""
        if self.num_done == len(self.records):
            self._idle.set()
        if self._listeners or self._enders:
            rid = record.request.id
            listener = self._listeners.pop(rid, None) or self._enders.pop(rid, None)
            if listener is not None:
                if reason is None:
                    reason = "abort" if record.outcome is Outcome.ABORTED else "error"
                listener(TokenEvent(None, reason, record.error))
        if self.on_done is not None:
            self.on_done(record)

    def forget(self, request_id: str) -> RequestRecord | None:
        """Drop a finished request's record (a long-running server would otherwise keep every
        record); returns it, or None if it is unknown or still pending."""
        record = self.records.get(request_id)
        if record is None or record.outcome is Outcome.PENDING:
            return None
        del self.records[request_id]
        self.num_done -= 1
        return record

    async def wait_idle(self) -> None:
        await self._idle.wait()
