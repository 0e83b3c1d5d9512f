"""Run in vLLM's own environment (``HFX_VLLM_PYTHON``), by tests/test_vllm_scheduler.py: a real
vLLM Scheduler (stock, or HFX's from hfx/backends/vllm/scheduler.py) driven with a fake model
output, as vLLM's own tests drive theirs (tests/v1/core/utils.py). Prints, as JSON, each
scenario's steps: {request id: tokens scheduled}.

    python tests/helpers/vllm_scheduler_probe.py CHECKPOINT PROFILE_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from hfx.backends.vllm.scheduler import HFXScheduler

BLOCK = 16
# Eq. 1/2 coefficients that make the arithmetic plain: a 10 ms step floor, 0.1 ms a prefill
# token, decodes free beyond the floor. A 50 ms TPOT leaves (50 - 10) / 0.1 = 400 prefill
# tokens a step; a 1,000-token prompt alone takes 10 + 100 = 110 ms.
PROFILE = {"prefill": {"a": 0.01, "b": 1e-4, "c": 0.0}, "decode": {"a": 0.01, "b": 0.0, "c": 0.0}}


def scheduler(cls: type[Scheduler], checkpoint: str, profile: str | None,
              num_blocks: int = 1000, policy: str = "fcfs", budget: int = 2048,
              max_num_seqs: int = 16) -> Scheduler:
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                         max_model_len=4096,
                         enable_chunked_prefill=True, async_scheduling=False,
                         is_encoder_decoder=False, policy=policy)
    mc = ModelConfig(model=checkpoint, dtype="float32", seed=0, skip_tokenizer_init=True)
    cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    extra = {"hfx": {"profile": profile}} if profile else {}
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                    additional_config=extra)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cc.num_gpu_blocks = num_blocks
    return cls(vllm_config=vc, kv_cache_config=kvc,
               structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK,
               log_stats=False)


_hasher = None


def request(rid: str, prompt: int, out: int, xargs: object = None,
            priority: int = 0) -> Request:
    global _hasher
    if _hasher is None:
        init_none_hash(sha256)
        _hasher = get_request_block_hasher(BLOCK, sha256)
    params = SamplingParams(max_tokens=out, ignore_eos=True, extra_args=xargs)
    return Request(request_id=rid, prompt_token_ids=[sum(map(ord, rid)) % 1000 + 1] * prompt,
                   sampling_params=params, pooling_params=None, arrival_time=time.time(),
                   block_hasher=_hasher, priority=priority)


def step(s: Scheduler, preempted: list[list[str]] | None = None,
         pause: float = 0.0) -> dict[str, int]:
    """One step; ``pause`` seconds pass between scheduling it and its output, as a model
    that runs that long would take."""
    out = s.schedule()
    time.sleep(pause)
    if preempted is not None:
        preempted.append(sorted(out.preempted_req_ids or ()))
    scheduled = dict(out.num_scheduled_tokens)
    ids = list(scheduled)
    # schedule() has advanced each request's computed count already: a token is sampled for
    # each that has computed all it holds (not for a prompt's chunk).
    sampled = [[7] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else []
               for r in scheduled]
    s.update_from_output(out, ModelRunnerOutput(req_ids=ids,
                                                req_id_to_index={r: i for i, r in enumerate(ids)},
                                                sampled_token_ids=sampled))
    return scheduled


def prompt_beside_decodes(cls: type[Scheduler], checkpoint: str, profile: str | None,
                          head_xargs: object, decode_xargs: object,
                          pause: float = 0.0) -> list[dict[str, int]]:
    """Four requests decoding (one prefill step, then one decode step), then a 1,000-token
    prompt arrives; the steps until it has its first token."""
    s = scheduler(cls, checkpoint, profile)
    for i in range(4):
        s.add_request(request(f"d{i}", 32, 50, decode_xargs))
    steps = [step(s, pause=pause), step(s, pause=pause)]
    s.add_request(request("p", 1000, 4, head_xargs))
    for _ in range(4):
        steps.append(step(s, pause=pause))
        if s.requests["p"].num_output_tokens:
            break
    return steps


# (request id, prompt tokens, output tokens, priority, the step it arrives before): the
# fidelity scenario of tests/test_vllm_scheduler.py, replayed on HFX's ``vllm`` planner there.
PRIORITY_SCENARIO = [("a", 40, 30, 200, 0), ("b", 40, 30, 50, 0), ("c", 30, 20, 20, 2),
                     ("d", 20, 10, 100, 4), ("e", 50, 8, 10, 9)]


def priority_scenario(checkpoint: str) -> dict[str, list]:
    """Stock vLLM with ``--scheduling-policy priority``, 10 usable blocks of 16 tokens and a
    64-token budget: requests of several priorities outgrow the KV and preempt."""
    s = scheduler(Scheduler, checkpoint, None, num_blocks=11, policy="priority", budget=64)
    plans: list[dict[str, int]] = []
    preempted: list[list[str]] = []
    for i in range(200):
        for rid, prompt, out, priority, at in PRIORITY_SCENARIO:
            if at == i:
                s.add_request(request(rid, prompt, out, priority=priority))
        if i > max(at for *_, at in PRIORITY_SCENARIO) and not s.requests:
            break
        plans.append(step(s, preempted))
    return {"scenario": PRIORITY_SCENARIO, "plans": plans, "preempted": preempted}


def deadline_order(cls: type[Scheduler], checkpoint: str, profile: str | None) -> list:
    """Three one-token requests queued at once, a prompt a step (a 40-token budget): the loose
    one first in, then one whose TTFT (1 ms) is past, then a tight one."""
    s = scheduler(cls, checkpoint, profile, budget=40)
    for rid, ttft in (("loose", 10_000), ("late", 1), ("tight", 1_000)):
        s.add_request(request(rid, 40, 1, {"hfx_ttft_ms": ttft, "hfx_tpot_ms": 50}))
    time.sleep(0.01)  # late's deadline passes
    return [step(s) for _ in range(3)]


def main() -> None:
    checkpoint, folder = sys.argv[1], Path(sys.argv[2])
    profile = folder / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    slo = {"hfx_ttft_ms": 10_000, "hfx_tpot_ms": 50}
    tight = {"hfx_ttft_ms": 300, "hfx_tpot_ms": 50}
    results = {
        "stock": prompt_beside_decodes(Scheduler, checkpoint, None, slo, slo),
        "paced": prompt_beside_decodes(HFXScheduler, checkpoint, str(profile), slo, slo),
        # Every step takes 0.25 s, over 4x what the profile predicts (at most 50 ms here).
        "slow": prompt_beside_decodes(HFXScheduler, checkpoint, str(profile), slo, slo,
                                      pause=0.25),
        "tight": prompt_beside_decodes(HFXScheduler, checkpoint, str(profile), tight, slo),
        "no_profile": prompt_beside_decodes(HFXScheduler, checkpoint,
                                            str(folder / "absent.json"), slo, slo),
        "malformed": prompt_beside_decodes(HFXScheduler, checkpoint, str(profile),
                                           {"hfx_ttft_ms": "soon", "hfx_tpot_ms": -5},
                                           {"hfx_tpot_ms": None, "hfx_ttft_ms": [1]}),
        "missing": prompt_beside_decodes(HFXScheduler, checkpoint, str(profile), None, None),
        "priority": priority_scenario(checkpoint),
        "order_stock": deadline_order(Scheduler, checkpoint, None),
        "order_hfx": deadline_order(HFXScheduler, checkpoint, str(profile)),
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
