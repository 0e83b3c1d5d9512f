# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""InstanceStats: a snapshot of one instance's engine, as the Monitor collects it.

A shared type: instances report it, the Monitor carries it, policies and the Scaler read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hfx.engine.sequence import Role


@dataclass(frozen=True, slots=True)
class InstanceStats:
    """A snapshot of one instance, as the Monitor collects it."""

    instance_id: int
    role: Role
    time: float
    num_waiting: int
    num_running: int
    num_held: int  # prefill role: prefilled requests waiting to migrate
    kv_used_blocks: int
    kv_waiting_blocks: int  # blocks its waiting requests will need when admitted
    kv_total_blocks: int
    block_size: int
    decode_ctx: int  # Σ l_cur over running sequences (what Eq. 2 needs)
    max_num_seqs: int  # sequences the engine runs at once
    busy_time: float  # seconds spent executing steps so far
    num_steps: int
    # Its prefix cache so far (vLLM's prefix-cache queries and hits): prompt tokens of first
    # admissions, those found cached; blocks cached and held by no request (counted free).
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    kv_cached_blocks: int = 0

    def __reduce__(self) -> tuple[type[InstanceStats], tuple[object, ...]]:
        # Through the constructor: compiled (hfx/native.py), a frozen class cannot be unpickled
        # field by field (stats travel from Ray actors).
        return InstanceStats, tuple(getattr(self, f) for f in _FIELDS)

    @property
    def kv_usage(self) -> float:
        return self.kv_used_blocks / self.kv_total_blocks


_FIELDS = tuple(InstanceStats.__dataclass_fields__)  # in the constructor's order
