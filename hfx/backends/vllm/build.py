"""A vLLM fleet from the configuration: the servers ``hfx serve --engine vllm`` runs on, and the
server ``hfx profile --engine vllm`` measures."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from hfx.backends.ray.cluster import join_ray
from hfx.backends.vllm.metrics import server_info
from hfx.backends.vllm.process import (
    ServerFactory,
    VLLMLaunch,
    VLLMPlacement,
    VLLMServer,
    example_connector,
)
from hfx.backends.vllm.profiler import VLLMGrid, profile_vllm
from hfx.config import ProfileConfig, ServeConfig
from hfx.stepmodel.latency import Profile


def vllm_placement(config: ServeConfig, name: str, max_len: int) -> VLLMPlacement:
    """The fleet of vLLM servers a ServeConfig asks for: ``--backend`` URLs, then servers
    started from ``--checkpoint`` (P/D: each a KV producer and consumer), a warm pool for the
    Scaler, each a child of a Ray actor with ``--ray``."""
    launch = None
    extra: list[str] = []
    if config.mode == "pd":  # every server a KV producer and consumer (HyperFlexis §5.1)
        connector = config.vllm_kv_transfer_config
        if connector is None:
            storage = tempfile.mkdtemp(prefix="hfx-kv-")
            atexit.register(shutil.rmtree, storage, ignore_errors=True)  # the KV files left
            connector = example_connector(storage)
        extra += ["--kv-transfer-config", connector]
    if config.max_num_batched_tokens is not None:  # the budget the calibration replays
        extra += ["--max-num-batched-tokens", str(config.max_num_batched_tokens)]
    if config.checkpoint is not None:
        launch = VLLMLaunch.of(config, config.checkpoint, name, max_len, config.max_num_seqs,
                               config.kv_capacity_tokens, config.block_size, config.device,
                               tuple(extra))
    warm = 0
    if config.max_instances is not None and launch is not None:  # as the provisioner counts
        initial = config.prefill + config.decode if config.mode == "pd" else config.instances
        warm = (config.warm_pool if config.warm_pool is not None
                else config.max_instances - initial)
    new_server: ServerFactory = VLLMServer
    if config.ray or config.ray_address:  # each server a child of a Ray actor, on any node
        if launch is None:
            raise ValueError("--ray starts vLLM servers: give --checkpoint (servers attached "
                             "with --backend run where their owner put them)")
        join_ray(config)
        from hfx.backends.vllm.ray_actor import ray_server_factory

        new_server = ray_server_factory(config.ray_cpus_per_instance,
                                        0 if launch.device == "cpu" else 1)
    return VLLMPlacement(launch, tuple(config.backend), config.max_num_seqs, warm, new_server,
                         config.upstream_idle_timeout)


def profile_server(config: ProfileConfig) -> Profile:
    """Fit the step-time model from a vLLM server: ``--backend``, else one started here."""
    server = None
    if config.backend:
        urls = list(config.backend)
    elif config.checkpoint is not None:
        launch = VLLMLaunch.of(config, config.checkpoint, Path(config.checkpoint).name,
                               max_model_len=4096, max_num_seqs=256,
                               kv_capacity_tokens=config.kv_tokens,
                               block_size=config.block_size, device=config.device)
        print("starting a vLLM server ...", flush=True)
        server = VLLMServer(launch, 0, 1).start()
        server.wait_ready_blocking()
        urls = [server.url]
    else:
        raise ValueError("--engine vllm needs --backend URL or --checkpoint DIR")
    try:
        info = server_info(urls[0])
        grid = VLLMGrid.quick() if config.quick else VLLMGrid()
        if config.repeats is not None:
            grid = replace(grid, repeats=config.repeats)
        return profile_vllm(urls, grid, info.kv_total_blocks * info.block_size,
                            info.block_size, config.checkpoint, progress=True)
    finally:
        if server is not None:
            server.kill()
