"""Where instances run: the initial fleet and each one the Scaler adds.

``LocalPlacement`` builds engines in this process (the simulator, and ``hfx serve`` without
Ray); ``hfx.cluster.ray_instance.RayPlacement`` starts Ray actors. The control plane and the
Scaler see only the Instance protocol either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from hfx.cluster.instance import Instance, LocalInstance
from hfx.engine import EngineConfig, EngineCore

EngineFactory = Callable[[EngineConfig], EngineCore]


class Placement(Protocol):
    def initial(self, configs: list[tuple[int, EngineConfig]]) -> list[Instance]:
        """The fleet at start: one instance per (id, engine config), ready to serve."""
        ...

    async def launch(self, instance_id: int, config: EngineConfig,
                     load_seconds: float) -> Instance:
        """One more instance, for the Scaler. ``load_seconds`` is the provisioner's modelled
        weight load (Table 2): a simulated instance waits it out, a real one takes what it
        takes."""
        ...


class LocalPlacement:
    """Engines from ``make_engine``, each driven by a task on this process's loop."""

    def __init__(self, make_engine: EngineFactory) -> None:
        self.make_engine = make_engine

    def initial(self, configs: list[tuple[int, EngineConfig]]) -> list[Instance]:
        return [LocalInstance(iid, self.make_engine(cfg)) for iid, cfg in configs]

    async def launch(self, instance_id: int, config: EngineConfig,
                     load_seconds: float) -> Instance:
        await asyncio.sleep(load_seconds)
        return LocalInstance(instance_id, self.make_engine(config))
