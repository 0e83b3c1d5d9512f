"""The engine's exceptions, in a module of their own: the engine core may be compiled (mypyc,
bench/sim/native_ab.py), and a compiled class cannot derive from a built-in exception with an
``__init__`` of its own."""

from __future__ import annotations

from hfx.engine.sequence import RequestStatus


class EngineError(ValueError):
    """A request this engine can never serve (too long for the model or the KV cache)."""


class StepFailed(RuntimeError):
    """The executor raised during a step; ``request_ids`` were in that step, which advanced
    nothing. ``transitions`` are the aborts applied before it (they still happened)."""

    def __init__(self, cause: BaseException, request_ids: list[str],
                 transitions: list[tuple[str, RequestStatus]]) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.request_ids = request_ids
        self.transitions = transitions
