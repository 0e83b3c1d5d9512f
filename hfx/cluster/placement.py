"""Where instances run: the initial fleet and each one the Scaler adds.

``LocalPlacement`` builds engines in this process (the simulator, and ``hfx serve`` without
Ray); ``hfx.cluster.ray_instance.RayPlacement`` starts Ray actors. The control plane and the
Scaler see only the Instance protocol either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from hfx.cluster.instance import Instance, LocalInstance
from hfx.cluster.provisioner import Plan
from hfx.engine import EngineConfig, EngineCore

EngineFactory = Callable[[EngineConfig], EngineCore]


@runtime_checkable
class WeightLoadingFactory(Protocol):
    """An engine factory whose engines hold real weights. ``loading(path, peer)`` is a factory
    whose engines get them by a weight path (seed 000 §6): ``d2d`` from a running peer (a
    ``WeightHandle``; None: this process's own), ``cpu`` from a host-memory copy, ``disk``."""

    @property
    def holds_weights(self) -> bool: ...

    def __call__(self, config: EngineConfig) -> EngineCore: ...

    def loading(self, path: str, peer: object | None = None) -> EngineFactory: ...


class Placement(Protocol):
    def initial(self, configs: list[tuple[int, EngineConfig]]) -> list[Instance]:
        """The fleet at start: one instance per (id, engine config), ready to serve."""
        ...

    async def launch(self, instance_id: int, config: EngineConfig, plan: Plan) -> Instance:
        """One more instance, for the Scaler, as the provisioner planned it: a simulated
        instance waits out the plan's modelled seconds (Table 2); a real one loads its weights
        by the plan's path and takes what that takes."""
        ...

    def describe_launch(self, plan: Plan) -> str:
        """How ``launch`` will bring up an instance for ``plan`` (the Scaler's event log)."""
        ...


class LocalPlacement:
    """Engines from ``make_engine``, each driven by a task on this process's loop; their
    outputs reach the control plane ``delivery`` seconds after each step (LocalInstance)."""

    def __init__(self, make_engine: EngineFactory, delivery: float = 0.0) -> None:
        self.make_engine = make_engine
        self.delivery = delivery

    def initial(self, configs: list[tuple[int, EngineConfig]]) -> list[Instance]:
        return [LocalInstance(iid, self.make_engine(cfg), self.delivery) for iid, cfg in configs]

    def describe_launch(self, plan: Plan) -> str:
        return plan.describe()

    async def launch(self, instance_id: int, config: EngineConfig, plan: Plan) -> Instance:
        if isinstance(self.make_engine, WeightLoadingFactory) and self.make_engine.holds_weights:
            # Real weights by the planned path, on a worker thread: the loop keeps serving
            # (the copies release the GIL).
            make = self.make_engine.loading(plan.path)
            engine = await asyncio.get_running_loop().run_in_executor(None, make, config)
        else:
            await asyncio.sleep(plan.seconds)
            engine = self.make_engine(config)
        return LocalInstance(instance_id, engine, self.delivery)
