"""How each serving instance builds its engine, and where a scaled-out one gets its weights.

``EngineSpec`` is picklable, so that a Ray actor builds its own engine: the weights are made or
read where they run, never shipped through the object store. Instances of the fleet at start
share one copy of the weights per process. An instance the Scaler adds loads them by the
provisioner's weight path (HyperFlexis §6 "Fast Scaling", Table 2) through the WeightManager:

- ``d2d``: copied from a running peer's published weights (a shared-memory segment; in another
  process, a Ray actor's, by its ``WeightHandle``);
- ``cpu``: restored from a host-memory copy kept for the warm pool;
- ``disk``: read from the checkpoint (random weights are saved once at start for this).

A path whose source is missing or fails falls back to disk, as the seed says; random weights with
no copy anywhere (a Ray actor asked for ``cpu``) are made again from their seed.
"""

from __future__ import annotations

import atexit
import functools
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hfx.engine import EngineConfig, EngineCore, SimExecutor
from hfx.stepmodel.latency import Profile

if TYPE_CHECKING:
    from hfx.model.build import LoadedModel
    from hfx.model.weight_manager import WeightHandle, WeightManager, WeightSources

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineSpec:
    executor: str  # "torch" or "sim"
    max_model_len: int
    # The instance's step times: the sim executor's, and a real engine's planner's.
    profile: Profile | None = None
    shape: str | None = None
    checkpoint: str | None = None
    dtype: str | None = None
    device: str | None = None
    weight_seed: int = 0
    load_path: str | None = None  # a scaled-out instance: its weight path
    peer: WeightHandle | None = None  # d2d from another process's running instance

    @property
    def holds_weights(self) -> bool:
        """Whether its engines run a real model (the sim executor has no weights to load)."""
        return self.executor != "sim"

    def __call__(self, config: EngineConfig) -> EngineCore:
        config = replace(config, max_model_len=self.max_model_len)
        if self.executor == "sim":
            assert self.profile is not None
            return EngineCore(config, SimExecutor(self.profile.model))
        from hfx.engine.torch_executor import real_engine

        model = self.model().model if self.load_path is None else self._load_by_path()
        return real_engine(model, config,
                           step_model=self.profile.model if self.profile is not None else None)

    def loading(self, path: str, peer: WeightHandle | None = None) -> EngineSpec:
        """This spec for a scaled-out instance whose weights come by ``path``."""
        return replace(self, load_path=path, peer=peer)

    def model(self) -> LoadedModel:
        """The process's shared weights (built or read once)."""
        return _load(self.shape, self.checkpoint, self.dtype, self.device, self.weight_seed)

    def _key(self) -> tuple:
        return self.shape, self.checkpoint, self.dtype, self.device, self.weight_seed

    def prepare(self, path: str, warm_pool: int = 0) -> None:
        """Off the scaling path, once, at start: publish this process's weights as the source
        ``path`` reads (and the disk copy it falls back to), and allocate ``warm_pool`` warm
        models — parameter memory allocated and touched, no weights (HyperFlexis §6's warm pool:
        runtimes up, weights not loaded)."""
        from hfx.model.build import resolve_dtype
        from hfx.model.weight_manager import (
            OffloadedWeights,
            WeightManager,
            WeightSources,
            warm_model,
        )
        from hfx.model.weights import save_checkpoint

        model = self.model().model
        device = self.device or "cpu"
        _WARM[self._key()] = [warm_model(model.shape, resolve_dtype(self.dtype, device), device)
                              for _ in range(warm_pool)]
        peer = host = None
        old = _MANAGERS.pop(self._key(), None)
        if old is not None:
            old.close()
        if path == "d2d":
            manager = _MANAGERS[self._key()] = WeightManager(model)
            atexit.register(manager.close)  # closing twice is harmless
            peer = manager.share()
        elif path == "cpu":
            host = OffloadedWeights(model)
        checkpoint = self.checkpoint
        if checkpoint is None and path in ("d2d", "disk"):  # random weights: a copy on disk
            folder = tempfile.mkdtemp(prefix="hfx-weights-")
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            checkpoint = str(save_checkpoint(model, folder))
        _SOURCES[self._key()] = WeightSources(peer, host, checkpoint)

    def _load_by_path(self):  # -> CausalLM
        from hfx.model.build import resolve_dtype
        from hfx.model.shapes import get_shape
        from hfx.model.weight_manager import (
            PeerUnavailable,
            WeightSources,
            fill_weights,
            warm_model,
        )
        from hfx.model.weights import random_model, read_config

        assert self.load_path is not None
        t0 = time.perf_counter()
        device = self.device or "cpu"
        dtype = resolve_dtype(self.dtype, device)
        shape = read_config(self.checkpoint) if self.checkpoint else get_shape(self.shape or "")
        sources = _SOURCES.get(self._key(), WeightSources(checkpoint=self.checkpoint))
        if self.peer is not None:
            sources = replace(sources, peer=self.peer)
        pool = _WARM.get(self._key())
        model = pool.pop() if pool else warm_model(shape, dtype, device)  # cold: allocate now
        try:
            taken = fill_weights(model, self.load_path, sources)
        except PeerUnavailable:
            model, taken = random_model(shape, self.weight_seed, dtype, device), "seed"
        log.info("weights loaded by %s (asked: %s) in %.3f s", taken, self.load_path,
                 time.perf_counter() - t0)
        return model


# This process's weight sources for scaled-out instances, by spec (see EngineSpec.prepare).
_SOURCES: dict[tuple, WeightSources] = {}
_MANAGERS: dict[tuple, WeightManager] = {}
_WARM: dict[tuple, list] = {}  # warm-pool models (CausalLM) without weights


@functools.cache
def _load(shape: str | None, checkpoint: str | None, dtype: str | None, device: str | None,
          seed: int) -> LoadedModel:
    """One copy of the weights per process, shared by every instance it runs."""
    from hfx.model.build import build_model

    return build_model(shape, checkpoint, dtype, device, seed)
