"""Batch planners, chosen by name from one registry."""

from __future__ import annotations

from hfx.engine.config import EngineConfig
from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput
from hfx.engine.planners.chunked import ChunkedPlanner
from hfx.engine.planners.credit import CreditPlanner
from hfx.engine.planners.prefill_first import PrefillFirstPlanner
from hfx.engine.planners.slo_paced import SLOPacedPlanner
from hfx.engine.planners.tpot_chunked import TPOTChunkedPlanner
from hfx.latency import StepTimeModel

PLANNERS: dict[str, type[BatchPlanner]] = {
    p.name: p for p in (PrefillFirstPlanner, ChunkedPlanner, CreditPlanner, SLOPacedPlanner,
                        TPOTChunkedPlanner)
}


def make_planner(config: EngineConfig, model: StepTimeModel | None = None) -> BatchPlanner:
    try:
        cls = PLANNERS[config.planner]
    except KeyError:
        raise ValueError(
            f"unknown planner {config.planner!r}; choose one of {', '.join(PLANNERS)}"
        ) from None
    if cls.needs_model and model is None:
        raise ValueError(f"planner {config.planner!r} needs the instance's step-time model")
    return cls(config, model)


__all__ = ["PLANNERS", "BatchPlanner", "EngineState", "SchedulerOutput", "make_planner"]
