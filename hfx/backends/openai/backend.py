"""The ``openai`` backend: ``hfx serve --engine openai --backend URL ... --checkpoint DIR``
dispatches to running OpenAI-compatible servers, and ``hfx profile --engine openai --backend
URL`` measures one."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hfx.backends.base import Served, Service, served_model
from hfx.backends.openai.instance import OpenAIPlacement
from hfx.backends.vllm.backend import VLLM_TOKEN_BUDGET
from hfx.backends.vllm.profiler import VLLMGrid, profile_vllm
from hfx.config import ProfileConfig, ServeConfig
from hfx.engine import Role
from hfx.stepmodel.latency import Profile, load_profile

if TYPE_CHECKING:
    from hfx.cluster.control import ControlPlane


class OpenAIBackend:
    """Running OpenAI-compatible servers, attached with --backend."""

    section = None  # the shared settings only (BackendSection's --backend)

    def serve(self, config: ServeConfig) -> Served:
        if not config.backend:
            raise ValueError("--engine openai attaches to running servers: give --backend URL, "
                             "once per server")
        if config.mode == "pd":
            raise ValueError("--engine openai serves colocated: P/D needs a KV connector "
                             "between the servers (--engine vllm)")
        if config.max_instances is not None:
            raise ValueError("--engine openai cannot start servers, so there is nothing to "
                             "scale: drop --max-instances (the Scaler needs --engine hfx or "
                             "vllm)")
        if config.checkpoint is None:
            raise ValueError("--engine openai needs --checkpoint: the served model's directory "
                             "(its tokenizer.json and config.json; the servers load the "
                             "weights themselves)")
        model = served_model(config.checkpoint, config.max_model_len)
        tokenizer, max_len = model.tokenizer, model.max_model_len
        probe_prompt = tokenizer.encode("Hello") or [1]
        kv_tokens = config.kv_capacity_tokens or 65536
        placement = OpenAIPlacement(tuple(config.backend), config.max_num_seqs,
                                    config.upstream_idle_timeout, tokenizer.encode, probe_prompt,
                                    kv_tokens, config.block_size, max_len)
        fleet = placement.prepare([(i, Role.COLOCATED) for i in range(config.instances)])
        for url, traits in placement.traits.items():
            kind = "an hfx serve" if traits.takes_slo else f"{traits.model!r}"
            print(f"{url} ({kind}) lacks, and HFX does without:", flush=True)
            for line in traits.lacks():
                print(f"  - {line}", flush=True)
        if config.profile is not None:
            profile = load_profile(config.profile)
        else:
            print("measuring a step-time profile of the servers, all at once (hfx profile "
                  "--engine openai; give --profile to skip) ...", flush=True)
            profile = profile_vllm([i.url for i in fleet], VLLMGrid.quick(), kv_tokens,
                                   config.block_size, config.checkpoint, engine="openai")
        info = fleet[0].info
        profile = replace(profile, kv_capacity_tokens=info.kv_total_blocks * info.block_size,
                          block_size=info.block_size)
        if not profile.meta.get("model"):
            config = config.model_copy(update={"kv_bytes_per_token": 1})

        def services(control: ControlPlane) -> list[Service]:
            from hfx.backends.vllm.healer import BackendHealer

            return [BackendHealer(control, placement, config.backend_check_interval)]

        # Servers HFX does not know the scheduling of: the dispatcher predicts their steps as
        # a first-come-first-served engine with chunked prefill (vLLM's, SGLang's and
        # llama.cpp's shape; an hfx serve runs HFX's deadline-chunked planner), and no live
        # calibration replays them against a planner that may not be theirs.
        every_hfx = all(t.takes_slo for t in placement.traits.values())
        return Served(config, config.served_model_name or fleet[0].info.model, tokenizer,
                      max_len, model.vocab_size, tokenizer.eos_token_id, profile, None,
                      placement, calibrate=False,
                      replay_planner="deadline-chunked" if every_hfx else "vllm-fcfs",
                      replay_token_budget=config.max_num_batched_tokens or VLLM_TOKEN_BUDGET,
                      close=lambda: None, services=services, streams_at_front=True,
                      fleet=f"{len(fleet)} OpenAI-compatible servers")

    def profile(self, config: ProfileConfig) -> Profile:
        """Fit the step-time model from the --backend servers (all at once), as a client
        sees them."""
        if not config.backend:
            raise ValueError("--engine openai measures running servers: give --backend URL")
        grid = VLLMGrid.quick() if config.quick else VLLMGrid()
        if config.repeats is not None:
            grid = replace(grid, repeats=config.repeats)
        return profile_vllm(list(config.backend), grid, config.kv_tokens, config.block_size,
                            config.checkpoint, progress=True, engine="openai")


OPENAI = OpenAIBackend()
