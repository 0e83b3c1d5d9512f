"""The decode cohort: the running sequences that decode one token on every decode step, advanced
by one counter instead of an update per sequence.

A member's token count is ``cohort_base + tick``: a decode step of the cohort increments
``tick`` once, whatever the number of members, and the step's shape is two running sums. The
events of one member — it crosses into a new KV block, or reaches ``max_tokens`` — are listed in
two calendars of ticks (tick_calendar.py), so a step costs the same for 1 or 256 members, and a
sequence costs work only at its own events (join, block crossing, finish, preemption, abort).

While a sequence is a member, its ``num_tokens``, ``num_computed_tokens`` and
``output_token_ids`` are brought up to date only when read outside the hot path: ``sync`` (on
leaving, and for whoever asks). A real executor samples a token per sequence, so the core keeps
those fields current itself on its steps and the counter only plans (``EngineCore._advance``).

Planners whose decode step takes every decoding sequence (prefill-first, TPOT-chunked,
deadline-chunked) plan with the cohort; those that pick which sequences decode (SLOs-Serve's
pacing, SCORPIO's credits, vLLM v1's budget-cut chunking) step each sequence.
"""

from __future__ import annotations

from collections.abc import Iterator

from hfx.engine.sequence import PLACEHOLDER_TOKEN, Sequence
from hfx.engine.tick_calendar import Crossings, Finishes


class DecodeCohort:
    __slots__ = ("_cross", "_finish", "_sum_base", "_tpots", "block_size", "ids", "members",
                 "moves", "tick")

    def __init__(self, block_size: int, events: bool = True) -> None:
        self.block_size = block_size
        # (request id, tick, joined) as members join and leave, in order, for the records: a
        # member's tokens are the times of ticks (join, leave] (RequestLedger). None: not kept
        # (a real executor's tokens are reported one by one).
        self.moves: list[tuple[str, int, bool]] | None = [] if events else None
        self.tick = 0  # decode steps the cohort has taken
        self.members: dict[Sequence, None] = {}
        self.ids: dict[str, None] = {}  # the members' request ids, for a step's token list
        self._sum_base = 0
        self._tpots: dict[float, int] = {}  # the members' TPOT targets, counted
        # Each member's finish, and its next block crossing, by tick.
        self._finish = Finishes()
        self._cross = Crossings()

    def __len__(self) -> int:
        return len(self.members)

    def __bool__(self) -> bool:
        return bool(self.members)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self.members)

    @property
    def decode_ctx(self) -> int:
        """Σ num_tokens over the members: what the step's decodes attend to."""
        return self._sum_base + len(self.members) * self.tick

    def min_tpot(self) -> float | None:
        """The tightest TPOT target among the members (None if none has one)."""
        return min(self._tpots) if self._tpots else None

    def join(self, seq: Sequence) -> None:
        """``seq`` sampled a token and decodes from the next step on."""
        base = seq.num_tokens - self.tick
        seq.cohort_base = base
        seq.in_cohort = True
        self.members[seq] = None
        self.ids[seq.request_id] = None
        self._sum_base += base
        if self.moves is not None:
            self.moves.append((seq.request_id, self.tick, True))
        tpot = seq.tpot
        if tpot:
            self._tpots[tpot] = self._tpots.get(tpot, 0) + 1
        # After tick T it holds base + T tokens: done at prompt + max_tokens.
        self._finish.put(seq, seq.prompt_len + seq.max_tokens - base)
        self._push_crossing(seq)

    def _push_crossing(self, seq: Sequence) -> None:
        # A decode at tick k writes the KV of token base + k: it needs a new block once that
        # passes the blocks it holds.
        cap = seq.num_blocks * self.block_size
        self._cross.put(seq, cap - seq.cohort_base + 1)

    def sync(self, seq: Sequence) -> None:
        """Bring a member's token fields up to the tick."""
        n = seq.cohort_base + self.tick
        behind = n - seq.num_tokens
        if behind:
            seq.num_tokens = n
            seq.num_computed_tokens = n - 1
            seq.output_token_ids.extend([PLACEHOLDER_TOKEN] * behind)

    def sync_all(self) -> None:
        for seq in self.members:
            self.sync(seq)

    def leave(self, seq: Sequence) -> None:
        """``seq`` stops decoding here (finished, preempted, aborted): synced, then removed."""
        self.sync(seq)
        del self.members[seq]
        del self.ids[seq.request_id]
        self._finish.drop(seq)
        self._cross.drop(seq)
        self._sum_base -= seq.cohort_base
        if self.moves is not None:
            self.moves.append((seq.request_id, self.tick, False))
        tpot = seq.tpot
        if tpot:
            left = self._tpots[tpot] - 1
            if left:
                self._tpots[tpot] = left
            else:
                del self._tpots[tpot]
        seq.in_cohort = False

    def discard(self, seq: Sequence) -> None:
        """``leave`` if ``seq`` is a member."""
        if seq.in_cohort:
            self.leave(seq)

    def crossing(self) -> list[Sequence]:
        """Members whose decode at this tick needs a new KV block, in running-list order (the
        order a per-sequence planner visits them in). The caller allocates, then ``crossed``."""
        return _in_running_order(self._cross.take(self.tick))

    def next_finish(self) -> int | None:
        """The tick at which the first member reaches ``max_tokens`` (None: no member)."""
        return self._finish.first()

    def crossing_ticks(self, last: int) -> list[int]:
        """The ticks, up to ``last``, at which members need their next KV block, sorted; each
        member's next one only (what a window of at most ``block_size`` ticks holds)."""
        return self._cross.due_by(last)

    def crossed(self, seq: Sequence) -> None:
        """``seq`` got its block: watch for the next crossing."""
        self._push_crossing(seq)

    def step(self) -> list[Sequence]:
        """One decode step of every member. Returns those it brought to ``max_tokens``, in
        running-list order, synced and removed."""
        self.tick += 1
        done = _in_running_order(self._finish.take(self.tick))
        for seq in done:
            self.leave(seq)
        return done

    def take_moves(self) -> list[tuple[str, int, bool]] | None:
        """The joins and leaves since the last call, or None if none."""
        moves = self.moves
        if not moves:
            return None
        self.moves = []
        return moves

    def purge(self) -> None:
        """Drop the finish entries up to the tick. With a real executor the core finishes
        members as their tokens come, so every such entry is stale."""
        self._finish.take(self.tick)

    def in_running_order(self) -> list[Sequence]:
        return sorted(self.members, key=_order)

    def clear(self) -> None:
        for seq in list(self.members):
            self.leave(seq)
        self._finish.clear()
        self._cross.clear()


def _order(seq: Sequence) -> int:
    return seq.order


def _in_running_order(seqs: list[Sequence]) -> list[Sequence]:
    if len(seqs) > 1:
        seqs.sort(key=_order)
    return seqs
