"""Batch planners, chosen by name from one registry."""

from __future__ import annotations

from hfx.engine.config import EngineConfig
from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput
from hfx.engine.planners.chunked import ChunkedPlanner
from hfx.engine.planners.credit import CreditPlanner
from hfx.engine.planners.prefill_first import PrefillFirstPlanner

PLANNERS: dict[str, type[BatchPlanner]] = {
    p.name: p for p in (PrefillFirstPlanner, ChunkedPlanner, CreditPlanner)
}


def make_planner(config: EngineConfig) -> BatchPlanner:
    try:
        cls = PLANNERS[config.planner]
    except KeyError:
        raise ValueError(
            f"unknown planner {config.planner!r}; choose one of {', '.join(PLANNERS)}"
        ) from None
    return cls(config)


__all__ = ["PLANNERS", "BatchPlanner", "EngineState", "SchedulerOutput", "make_planner"]
