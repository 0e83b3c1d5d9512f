"""The Monitor: periodic snapshots of every instance (HyperFlexis §4, §9.3).

Policies read the latest snapshot, not the engines. The default interval is 1 s, the seed's
choice after its ablation (HyperFlexis §9.3: 50 ms, 1 s and 5 s perform alike; 1 s balances
responsiveness and overhead).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from hfx.cluster.instance import Instance
from hfx.engine.stats import InstanceStats
from hfx.sim.clock import cancel

DEFAULT_MONITOR_INTERVAL = 1.0  # seconds, HyperFlexis §9.3


class Monitor:
    def __init__(self, interval: float = DEFAULT_MONITOR_INTERVAL) -> None:
        if interval <= 0:
            raise ValueError(f"monitor interval must be positive, got {interval}")
        self.interval = interval
        self.latest: dict[int, InstanceStats] = {}
        self._task: asyncio.Task[None] | None = None

    def collect(self, instances: Iterable[Instance]) -> dict[int, InstanceStats]:
        self.latest = {inst.id: inst.stats() for inst in instances}
        return self.latest

    def start(self, instances: Callable[[], Iterable[Instance]],
              on_snapshot: Callable[[dict[int, InstanceStats]], None]) -> None:
        async def tick() -> None:
            while True:
                await asyncio.sleep(self.interval)
                on_snapshot(self.collect(instances()))

        self.collect(instances())
        self._task = asyncio.get_running_loop().create_task(tick(), name="monitor")

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None
