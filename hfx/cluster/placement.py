"""Where instances run: the initial fleet and each one the Scaler adds.

Each backend has one (hfx/backends/): ``LocalPlacement`` builds engines in this process (the
simulator, and ``hfx serve`` without Ray), ``RayPlacement`` starts Ray actors,
``VLLMPlacement`` vLLM servers. The control plane and the Scaler see only the Instance
protocol either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from hfx.cluster.instance import Instance
from hfx.cluster.provisioner import Plan
from hfx.engine import EngineConfig, EngineCore

EngineFactory = Callable[[EngineConfig], EngineCore]


@runtime_checkable
class WeightLoadingFactory(Protocol):
    """An engine factory whose engines hold real weights. ``loading(path, peer)`` is a factory
    whose engines get them by a weight path (HyperFlexis §6): ``d2d`` from a running peer (a
    ``WeightHandle``; None: this process's own), ``cpu`` from a host-memory copy, ``disk``."""

    @property
    def holds_weights(self) -> bool: ...

    def __call__(self, config: EngineConfig) -> EngineCore: ...

    def loading(self, path: str, peer: object | None = None) -> EngineFactory: ...


class Placement(Protocol):
    def initial(self, configs: list[tuple[int, EngineConfig]]) -> Sequence[Instance]:
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
