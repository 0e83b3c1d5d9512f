"""Batch planners, chosen by name from one registry (import paths, resolved on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hfx.registry import Registry, lazy_exports

if TYPE_CHECKING:  # the lazy names' types: without them, mypy and mypyc see Any
    from hfx.engine.config import EngineConfig
    from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput  # noqa: F401
    from hfx.stepmodel.step_time import StepTimeModel

PLANNERS: Registry[type[BatchPlanner]] = Registry("planner", {
    "prefill-first": "hfx.engine.planners.prefill_first:PrefillFirstPlanner",
    "chunked": "hfx.engine.planners.chunked:ChunkedPlanner",
    "credit": "hfx.engine.planners.credit:CreditPlanner",
    "slo-paced": "hfx.engine.planners.slo_paced:SLOPacedPlanner",
    "tpot-chunked": "hfx.engine.planners.tpot_chunked:TPOTChunkedPlanner",
    "deadline-chunked": "hfx.engine.planners.deadline_chunked:DeadlineChunkedPlanner",
    "vllm": "hfx.engine.planners.vllm:VLLMPlanner",
    "vllm-fcfs": "hfx.engine.planners.vllm:VLLMFCFSPlanner",
})


def make_planner(config: EngineConfig, model: StepTimeModel | None = None) -> BatchPlanner:
    cls = PLANNERS.get_or_raise(config.planner)
    if cls.needs_model and model is None:
        raise ValueError(f"planner {config.planner!r} needs the instance's step-time model: "
                         "give the engine one (its profile's), or choose a planner that "
                         "paces nothing (prefill-first, chunked)")
    return cls(config, model)


_BASE = ("BatchPlanner", "EngineState", "SchedulerOutput")
__getattr__ = lazy_exports(__name__, dict.fromkeys(_BASE, "hfx.engine.planners.base"))


__all__ = ["PLANNERS", *_BASE, "make_planner"]
