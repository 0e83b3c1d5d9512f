# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The decode cohort: the running sequences that decode one token on every decode step, advanced
by one counter instead of an update per sequence.

A member's token count is ``cohort_base + tick``: a decode step of the cohort increments
``tick`` once, whatever the number of members, and the step's shape is two running sums. Its
finish (``max_tokens``) and its first crossing into a new KV block are listed in calendars of
ticks (tick_calendar.py). After its first crossing a member crosses every ``block_size`` ticks,
at the ticks ``t`` with ``cohort_base + t ≡ 1 (mod block_size)``: the cohort counts members by
that phase, so a tick's crossings are one count. While the free blocks hold them all, they are
taken from the block manager in that one count and each member's ``num_blocks`` catches up when
it is synced; a tick whose crossings do not all fit lists its crossing members for the planner
to allocate one by one, preempting as a per-sequence pass would. A step thus costs the same for
1 or 256 members, and a sequence costs work only at its own events (join, first crossing,
finish, preemption, abort).

While a sequence is a member, its ``num_tokens``, ``num_computed_tokens``,
``output_token_ids`` and ``num_blocks`` are brought up to date only when read outside the hot
path: ``sync`` (on leaving, and for whoever asks). A real executor samples a token per
sequence, so the core keeps the token fields current itself on its steps and the counter only
plans (``EngineCore._advance``); it reads each block's id, so its members get their blocks one
by one.

Planners whose decode step takes every decoding sequence (prefill-first, TPOT-chunked,
deadline-chunked) plan with the cohort. The budget-cut ones (chunked, vLLM v1's) do in every
step whose per-sequence pass would decode every member first and preempt nobody
(planners/chunked.py, ``plan_cohort_first``); in any other step the members leave and are
stepped one by one, and join again with their next token. Those that pick which sequences
decode (SLOs-Serve's pacing, SCORPIO's credits) step each sequence.
"""

from __future__ import annotations

from collections.abc import Iterator

from hfx.engine.block_manager import BlockManager
from hfx.engine.sequence import IN_PHASE, NO_EVENT, PLACEHOLDER_TOKEN, Sequence
from hfx.engine.tick_calendar import Crossings, Finishes
from hfx.tally import Tally


class DecodeCohort:
    __slots__ = ("_charged", "_cross", "_finish", "_kv", "_listed", "_phase", "_sum_base",
                 "_tpots", "block_size", "members", "moves", "tick")

    def __init__(self, block_size: int, events: bool = True,
                 kv: BlockManager | None = None) -> None:
        self.block_size = block_size
        # The engine's blocks, taken in one count per tick (``crossing``). None: each crossing
        # member gets its block on its own, for an executor that reads the blocks' ids.
        self._kv = kv
        # Members past their first crossing, by the phase of their crossings: _phase[t % bs]
        # members cross at tick t. Every tick up to _charged has had them allocated.
        self._phase = [0] * block_size
        self._charged = -1
        # (request id, tick, joined) as members join and leave, in order, for the records: a
        # member's tokens are the times of ticks (join, leave] (RequestLedger). None: not kept
        # (a real executor's tokens are reported one by one).
        self.moves: list[tuple[str, int, bool]] | None = [] if events else None
        self.tick = 0  # decode steps the cohort has taken
        self.members: dict[Sequence, None] = {}
        self._sum_base = 0
        self._tpots = Tally()  # the members' TPOT targets
        # Each member's finish, and its first block crossing, by tick.
        self._finish = Finishes()
        self._cross = Crossings()
        # Ticks whose crossings are allocated one by one although they fit: a member's first
        # crossing there also caches prompt units (its ``allocate`` offers them, interleaved
        # with the others' claims in running order).
        self._listed: set[int] = set()

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
        return self._tpots.tightest()

    def join(self, seq: Sequence) -> None:
        """``seq`` sampled a token and decodes from the next step on."""
        base = seq.num_tokens - self.tick
        seq.cohort_base = base
        seq.in_cohort = True
        self.members[seq] = None
        self._sum_base += base
        if self.moves is not None:
            self.moves.append((seq.request_id, self.tick, True))
        tpot = seq.tpot
        if tpot:
            self._tpots.add(tpot)
        # After tick T it holds base + T tokens: done at prompt + max_tokens.
        self._finish.put(seq, seq.prompt_len + seq.max_tokens - base)
        # A decode at tick k writes the KV of token base + k: it needs a new block once that
        # passes the blocks it holds.
        due = seq.num_blocks * self.block_size - base + 1
        self._cross.put(seq, due)
        kv = self._kv
        if kv is not None and kv.offers_pending(seq):
            self._listed.add(due)

    def blocks(self, seq: Sequence) -> int:
        """A member's KV blocks, as a sync would make its ``num_blocks``."""
        if seq.cross_due != IN_PHASE:
            return seq.num_blocks  # it has not crossed, or got each block on its own
        held = -(-(seq.cohort_base + self._charged) // self.block_size)
        return held if held > seq.num_blocks else seq.num_blocks

    def sync(self, seq: Sequence) -> None:
        """Bring a member's token fields and block count up to the tick."""
        n = seq.cohort_base + self.tick
        behind = n - seq.num_tokens
        if behind:
            seq.num_tokens = n
            seq.num_computed_tokens = n - 1
            seq.output_token_ids.extend([PLACEHOLDER_TOKEN] * behind)
        if seq.cross_due == IN_PHASE:
            seq.num_blocks = self.blocks(seq)

    def sync_all(self) -> None:
        for seq in self.members:
            self.sync(seq)

    def leave(self, seq: Sequence) -> None:
        """``seq`` stops decoding here (finished, preempted, aborted): synced, then removed."""
        self.sync(seq)
        del self.members[seq]
        self._finish.drop(seq)
        if seq.cross_due == IN_PHASE:
            self._phase[(1 - seq.cohort_base) % self.block_size] -= 1
            seq.cross_due = NO_EVENT
        else:
            self._cross.drop(seq)
        self._sum_base -= seq.cohort_base
        if self.moves is not None:
            self.moves.append((seq.request_id, self.tick, False))
        tpot = seq.tpot
        if tpot:
            self._tpots.discard(tpot)
        seq.in_cohort = False

    def discard(self, seq: Sequence) -> None:
        """``leave`` if ``seq`` is a member."""
        if seq.in_cohort:
            self.leave(seq)

    def crossing(self) -> list[Sequence]:
        """Plan this tick's block crossings. When the free blocks hold them all (and the
        cohort was given the block manager), they are taken in one count and nothing is
        returned. Otherwise the members whose decode at this tick needs a new KV block, in
        running-list order (the order a per-sequence planner visits them in), each with its
        ``num_blocks`` current: the caller allocates each, then ``crossed``."""
        tick, size = self.tick, self.block_size
        firsts = self._cross.take(tick)
        kv = self._kv
        # A listed tick's crossings go one by one (a member that left meanwhile leaves its
        # tick listed: one by one is exact too, only slower).
        listed = tick in self._listed
        if listed:
            self._listed.discard(tick)
        if kv is not None and not listed:
            need = self._phase[tick % size] if tick > self._charged else 0
            for seq in firsts:  # the blocks it lacks at this tick: one, as it is due now
                need += -(-(seq.cohort_base + tick) // size) - seq.num_blocks
            if kv.take(need):
                for seq in firsts:
                    seq.num_blocks = -(-(seq.cohort_base + tick) // size)
                    self.crossed(seq)
                if tick > self._charged:
                    self._charged = tick
                return []
        if tick > self._charged:
            if self._phase[tick % size]:
                # The phase's members leave it until they get their block (``crossed``): a
                # sync meanwhile (one preempted first) counts only the blocks they hold.
                for seq in self.members:
                    if seq.cross_due == IN_PHASE and (seq.cohort_base + tick) % size == 1 % size:
                        seq.num_blocks = self.blocks(seq)
                        seq.cross_due = NO_EVENT
                        firsts.append(seq)
                self._phase[tick % size] = 0
            self._charged = tick
        return _in_running_order(firsts)

    def crossed(self, seq: Sequence) -> None:
        """``seq`` got the block it crossed into: it crosses by phase from now on."""
        seq.cross_due = IN_PHASE
        self._phase[(1 - seq.cohort_base) % self.block_size] += 1

    def next_listed(self) -> int | None:
        """The first tick from this one whose crossings are allocated one by one (None: no
        such tick): a decode run, which takes them in counts, ends before it."""
        listed = self._listed
        if not listed:
            return None
        for t in [t for t in listed if t < self.tick]:
            listed.discard(t)  # a member left before its tick
        return min(listed) if listed else None

    def next_finish(self) -> int | None:
        """The tick at which the first member reaches ``max_tokens`` (None: no member)."""
        return self._finish.first()

    def ticks_with_blocks(self, length: int, free: int) -> int:
        """How many of the next ``length`` ticks (at most ``block_size``: a member crosses at
        most once in them) ``free`` blocks carry the crossings of: the first tick whose
        crossings would find no block left, counted from this one."""
        tick, size, phase = self.tick, self.block_size, self._phase
        firsts = self._cross.due_by(tick + length - 1)
        j, used = 0, 0
        for i in range(length):
            t = tick + i
            if t > self._charged:
                used += phase[t % size]
            while j < len(firsts) and firsts[j] <= t:
                used += 1
                j += 1
            if used > free:
                return i
        return length

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
        self._listed.clear()


def _order(seq: Sequence) -> int:
    return seq.order


def _in_running_order(seqs: list[Sequence]) -> list[Sequence]:
    if len(seqs) > 1:
        seqs.sort(key=_order)
    return seqs
