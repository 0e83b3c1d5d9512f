"""The ``vllm`` backend: a fleet of vLLM OpenAI servers from the configuration — the servers
``hfx serve --engine vllm`` dispatches to, and the server ``hfx profile --engine vllm``
measures."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hfx.backends.base import Served, Service, served_model
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
from hfx.engine import Role
from hfx.stepmodel.latency import Profile, load_profile

if TYPE_CHECKING:
    from hfx.cluster.control import ControlPlane


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


# vLLM 0.32's default max_num_batched_tokens for its OpenAI server on CPU: what the servers HFX
# starts use unless --max-num-batched-tokens is given (then passed to them). Servers attached
# with --backend may run another; give it as --max-num-batched-tokens.
VLLM_TOKEN_BUDGET = 2048


class VLLMBackend:
    """vLLM OpenAI servers, started from --checkpoint or attached with --backend."""

    section = "vllm"  # VLLMSection

    def serve(self, config: ServeConfig) -> Served:
        """The servers, running; the checkpoint gives the gateway its tokenizer and limits (the
        servers load the weights themselves); the profile is the dispatcher's view of their
        step times (--profile, else measured on all of them at start)."""
        if config.checkpoint is None:
            raise ValueError("--engine vllm needs --checkpoint: the model directory the "
                             "servers load, and where the gateway reads the tokenizer")
        model = served_model(config.checkpoint, config.max_model_len)
        max_len = model.max_model_len
        name = config.served_model_name or Path(config.checkpoint).name
        placement = vllm_placement(config, name, max_len)
        roles = ([Role.PREFILL] * config.prefill + [Role.DECODE] * config.decode
                 if config.mode == "pd" else [Role.COLOCATED] * config.instances)
        fleet = placement.prepare(list(enumerate(roles)))

        def close() -> None:
            for inst in fleet:
                if inst.process is not None:
                    inst.process.kill()
            for warm in placement.warm:
                warm.kill()

        info = fleet[0].info
        try:
            if config.profile is not None:
                profile = load_profile(config.profile)
            else:
                print("measuring a step-time profile of the vLLM servers, all at once (hfx "
                      "profile --engine vllm; give --profile to skip) ...", flush=True)
                profile = profile_vllm([i.url for i in fleet], VLLMGrid.quick(),
                                       info.kv_total_blocks * info.block_size, info.block_size,
                                       config.checkpoint)
        except BaseException as e:
            for inst in fleet:  # a server that died under the profile says why in its log
                if inst.process is not None and not inst.process.alive():
                    tail = (f"; log {inst.process.log_path}:\n{inst.process.log_tail()}"
                            if isinstance(inst.process, VLLMServer) else "")
                    e.add_note(f"the vLLM server at {inst.url} has exited{tail}")
            close()
            raise
        # The dispatcher plans with the servers' own KV size.
        profile = replace(profile, kv_capacity_tokens=info.kv_total_blocks * info.block_size,
                          block_size=info.block_size)
        launch = placement.spec
        if launch is not None and launch.scheduler == "hfx":
            # HFX's scheduler in each started server plans from it (scheduler.py); whole or
            # not at all, as the servers may read it meanwhile.
            written = launch.scheduler_profile.with_suffix(".tmp")
            profile.save(written)
            os.replace(written, launch.scheduler_profile)
        if not profile.meta.get("model"):
            config = config.model_copy(update={"kv_bytes_per_token": 1})

        def services(control: ControlPlane) -> list[Service]:
            if not placement.attached:
                return []
            from hfx.backends.vllm.healer import BackendHealer

            return [BackendHealer(control, placement, config.backend_check_interval)]

        # The servers' scheduler as a calibration replays it, and its budget: HFX's planner
        # in the servers HFX started with it, else vLLM's (hfx/engine/planners/vllm.py).
        hfx_inside = launch is not None and launch.scheduler == "hfx" and not config.backend
        return Served(config, name, model.tokenizer, max_len, model.vocab_size,
                      model.eos_token_id, profile,
                      None, placement,
                      replay_planner="deadline-chunked" if hfx_inside else "vllm",
                      replay_token_budget=config.max_num_batched_tokens or VLLM_TOKEN_BUDGET,
                      close=close, services=services, streams_at_front=True,
                      fleet=f"{len(fleet)} vLLM servers")

    def profile(self, config: ProfileConfig) -> Profile:
        return profile_server(config)


VLLM = VLLMBackend()
