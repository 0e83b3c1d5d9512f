"""The Instance protocol the control plane sees (hfx/backends/ has the kinds of instance).

The control plane never knows which kind of instance it holds: in-process, a Ray actor, or an
upstream server all submit requests, abort them, report a stats snapshot, and stream token
events back through the sink they were given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hfx.engine import (
    InstanceStats,
    Role,
    Sequence,
    StepOutput,
)
from hfx.request import Request

EventSink = Callable[[int, StepOutput], None]

class Instance(Protocol):
    id: int
    role: Role

    def submit(self, request: Request, best_effort: bool = False) -> None:
        """Queue a request; raises hfx.engine.EngineError if it can never run here.
        A best-effort request runs on leftover capacity (planners that know the tier)."""
        ...

    def check(self, request: Request) -> None:
        """Raise hfx.engine.EngineError if ``request`` can never run here (its size)."""
        ...

    def abort(self, request_id: str) -> None: ...

    def migration_state(self, request_id: str) -> Sequence: ...

    def reserve_import(self, state: Sequence) -> bool: ...

    def export(self, request_id: str) -> object | None:
        """Free a migrated request's KV here; return a copy of it (None in simulation)."""
        ...

    def activate_import(self, request_id: str, kv: object | None = None) -> None: ...

    def set_role(self, role: Role) -> None: ...

    def stats(self) -> InstanceStats: ...

    def start(self, sink: EventSink) -> None: ...

    async def stop(self) -> None: ...
