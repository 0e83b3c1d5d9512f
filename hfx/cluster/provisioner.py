"""Provisioning: how long a new instance takes to serve, and the warm pool (HyperFlexis §6 "Fast
Scaling"; HFX paper §3.4).

A warm-pool instance has its runtime up and no weights (the pool size defaults to the devices
not in use). Its time to serve is the weight load alone, by one of three paths:

    time = start + bytes per device / bandwidth of the path

- ``d2d``: copied device-to-device from a running peer (the WeightManager of every running
  instance is a weight source); falls back to ``disk`` when it fails or no peer runs;
- ``cpu``: reloaded from weights offloaded to host memory;
- ``disk``: read from storage.

Defaults are calibrated so that Qwen2.5-7B (15.2 GB, TP1) reproduces HyperFlexis Table 2 exactly:
D2D 0.89 s, CPU offloading 2.73 s, disk 4.14 s, with a 0.5 s start common to all paths (engine
warm-up after the weights land). Without a warm instance the runtime must start first
(``cold_start``, 20 s: our estimate for a vLLM-Ascend process on a fresh device; the seeds give
none). A measured profile from a real engine (JSON with the seconds per path for a model) replaces
the model when given.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

WEIGHT_PATHS = ("d2d", "cpu", "disk")
START = 0.5  # seconds, common to every path
# Bytes/s per device, so that 15.2 GB gives Table 2's 0.89 / 2.73 / 4.14 s with START.
BANDWIDTH = {"d2d": 15.2e9 / (0.89 - START), "cpu": 15.2e9 / (2.73 - START),
             "disk": 15.2e9 / (4.14 - START)}
COLD_START = 20.0  # seconds to bring up a runtime with no warm instance (ours)


@dataclass(frozen=True, slots=True)
class LoadModel:
    """Seconds until a new instance serves, by weight path."""

    bytes_per_device: float
    measured: dict[str, float] | None = None  # path → seconds, from a real engine

    def load_time(self, path: str) -> float:
        if path not in WEIGHT_PATHS:
            raise ValueError(f"unknown weight path {path!r}; choose one of {WEIGHT_PATHS}")
        if self.measured and path in self.measured:
            return self.measured[path]
        return START + self.bytes_per_device / BANDWIDTH[path]

    @classmethod
    def from_file(cls, path: str | Path, bytes_per_device: float) -> LoadModel:
        data = json.loads(Path(path).read_text())
        try:
            measured = {k: float(data["load_seconds"][k]) for k in data["load_seconds"]}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"{path}: expected {{'load_seconds': {{path: seconds}}}}: {e!r}") from None
        return cls(bytes_per_device, measured)


@dataclass(slots=True)
class Plan:
    """How one scale-out will happen."""

    path: str  # the weight path actually used
    seconds: float  # until the instance serves
    warm: bool
    fell_back: bool  # d2d was asked for and failed (or had no peer)

    def describe(self) -> str:
        """For the Scaler's event log: the weight path, warm or cold, the modelled time."""
        return (f"{self.path}{' (d2d failed)' if self.fell_back else ''}, "
                f"{'warm' if self.warm else 'cold'}, {self.seconds:.2f} s")


class Provisioner:
    def __init__(self, load: LoadModel, path: str = "d2d", warm_pool: int = 0,
                 cold_start: float = COLD_START, d2d_failure_rate: float = 0.0,
                 seed: int = 0) -> None:
        if path not in WEIGHT_PATHS:
            raise ValueError(f"unknown weight path {path!r}; choose one of {WEIGHT_PATHS}")
        if warm_pool < 0 or cold_start < 0 or not 0.0 <= d2d_failure_rate <= 1.0:
            raise ValueError("need warm_pool >= 0, cold_start >= 0, 0 <= d2d_failure_rate <= 1")
        self.load = load
        self.path = path
        self.warm_pool = warm_pool
        self.cold_start = cold_start
        self.d2d_failure_rate = d2d_failure_rate
        self._rng = random.Random(seed)

    def plan(self, peers_running: int) -> Plan:
        """Take a warm instance if one is left, and choose the weight path."""
        warm = self.warm_pool > 0
        if warm:
            self.warm_pool -= 1
        path, fell_back = self.path, False
        if path == "d2d" and (peers_running == 0 or self._rng.random() < self.d2d_failure_rate):
            path, fell_back = "disk", True  # HyperFlexis §6: on failure, fall back to disk
        seconds = self.load.load_time(path) + (0.0 if warm else self.cold_start)
        return Plan(path, seconds, warm, fell_back)

    def give_back(self) -> None:
        """A released instance's device rejoins the warm pool (its runtime stays up)."""
        self.warm_pool += 1
