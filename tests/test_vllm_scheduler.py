"""HFX's batch planner inside vLLM (hfx/backends/vllm/scheduler.py; the ``vllm`` tier).

A real vLLM Scheduler, stock and HFX's, driven with a fake model output in vLLM's own
environment (tests/helpers/vllm_scheduler_probe.py): exact token counts per step, the same as
HFX's own deadline-chunked planner plans on the same coefficients, and stock vLLM's steps
wherever a request's extra arguments are missing or malformed or no profile is there. Then a
vLLM server started by ``hfx serve`` with it (the default): preemption, aborts, prefix
caching, structured output and malformed extra arguments, and it never stops serving.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

from helpers.vllm_tier import ARGS, PYTHON, vllm_metrics, wait_for  # noqa: E402

# isort: split
import httpx  # noqa: E402
from conftest import make_engine, seq  # noqa: E402
from helpers.live import Running  # noqa: E402

from hfx.stepmodel.latency import Profile  # noqa: E402
from hfx.stepmodel.step_time import StepTimeModel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "helpers" / "vllm_scheduler_probe.py"
# The probe's coefficients (its PROFILE).
MODEL = StepTimeModel(0.01, 1e-4, 0.0, 0.01, 0.0, 0.0)


@pytest.fixture(scope="module")
def probed(mini_checkpoint, tmp_path_factory) -> dict[str, list[dict[str, int]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([PYTHON, str(PROBE), mini_checkpoint,
                           str(tmp_path_factory.mktemp("probe"))],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def prompt_chunks(steps: list[dict[str, int]]) -> list[int]:
    return [s["p"] for s in steps if "p" in s]


def own_engine_chunks(vloop, ttft: float) -> list[int]:
    """The probe's scenario on HFX's own engine and deadline-chunked planner."""
    engine, ex = make_engine(num_blocks=1000, block_size=16, planner="deadline-chunked",
                             max_num_batched_tokens=2048, step_model=MODEL)

    async def scenario():
        for i in range(4):
            engine.add_request(seq(f"d{i}", 32, 50, tpot=0.05))
        await engine.step()
        await engine.step()
        now = vloop.time()
        engine.add_request(seq("p", 1000, 4, tpot=0.05, prefill_deadline=now + ttft))
        for _ in range(4):
            await engine.step()

    vloop.run_until_complete(scenario())
    chunks = [plan["p"] for plan in ex.plans if "p" in plan]
    while sum(chunks) > 1000:  # its decodes after its first token
        chunks.pop()
    return chunks


def test_stock_vllm_runs_the_prompt_whole_in_its_budget(probed):
    assert prompt_chunks(probed["stock"]) == [1000]
    assert probed["stock"][2] == {"d0": 1, "d1": 1, "d2": 1, "d3": 1, "p": 1000}


def test_hfx_paces_a_prompt_beside_decodes_as_its_own_planner_does(probed, vloop):
    # 50 ms TPOT, 10 ms floor, 0.1 ms a token: 400 tokens a step; the last 600 are under two
    # budgets and run whole (PolyServe's dynamic chunking). Decodes go every step.
    assert prompt_chunks(probed["paced"]) == [400, 600] == own_engine_chunks(vloop, 10.0)
    assert all({f"d{i}" for i in range(4)} <= set(s) for s in probed["paced"][1:])


def test_hfx_paces_slower_steps_with_smaller_chunks(probed):
    """Steps that take over 4x the profile count as 4x (pacing.PACE_RANGE), each moving the pace
    by 5%: 1.15 and 1.29 after the decodes' two steps, then 1.43, 1.56, 1.68. The 50 ms TPOT's
    budget, (50 − 10·s) / (0.1·s), is 286, 250, 221 tokens; the last 243 are under two budgets
    (197) and run whole."""
    assert prompt_chunks(probed["slow"]) == [286, 250, 221, 243]
    assert prompt_chunks(probed["paced"]) == [400, 600]  # the same steps, quick: the profile


def test_hfx_runs_a_prompt_whole_when_paced_chunks_would_miss_its_ttft(probed, vloop):
    # 300 ms to the deadline: paced (3 × 50 ms) > 0.4 × 300 ms, alone 110 ms keeps it.
    assert prompt_chunks(probed["tight"]) == [1000] == own_engine_chunks(vloop, 0.3)


def test_hfx_starts_the_earliest_ttft_deadline_first_and_the_late_last(probed):
    # Stock vLLM: first come first served. HFX's: by deadline, one already past it last, as
    # its own deadline-chunked planner orders them (DeadlineWaitingQueue).
    assert probed["order_stock"] == [{"loose": 40}, {"late": 40}, {"tight": 40}]
    assert probed["order_hfx"] == [{"tight": 40}, {"loose": 40}, {"late": 40}]


@pytest.mark.parametrize("case", ["no_profile", "malformed", "missing"])
def test_without_what_the_plan_needs_vllm_schedules_as_stock(probed, case):
    assert probed[case] == probed["stock"]


# ---- a server hfx serve started with it ------------------------------------------------------
@pytest.fixture(scope="module")
def gw(mini_checkpoint, tmp_path_factory):
    # A profile of the mini model's order on a CPU core (given: no measuring at start).
    profile = tmp_path_factory.mktemp("profile") / "cpu.json"
    Profile("mini@cpu", StepTimeModel(0.02, 2e-4, 0.0, 0.02, 1e-6, 1e-4), 2048, 32).save(profile)
    # 2,048 tokens of KV for requests of ~300 tokens each: eight at once preempt.
    running = Running(engine="vllm", checkpoint=mini_checkpoint, instances=1,
                      vllm_python=PYTHON, vllm_args=ARGS, kv_capacity_tokens=2048,
                      max_model_len=1024, policy="least-loaded", max_wait=None,
                      profile=str(profile))
    yield running
    running.close()


def server(gw):
    (inst,) = gw.server.control.instances.values()
    return inst


def server_log(gw) -> str:
    return Path(server(gw).process.log_path).read_text(errors="replace")


def test_hfx_serve_starts_vllm_with_hfx_scheduler_and_its_profile(gw):
    log = server_log(gw)
    assert "hfx.backends.vllm.scheduler.HFXScheduler" in log
    gw.client.completions.create(model=gw.model, prompt="warm up", max_tokens=2,
                                 extra_body={"slo": {"ttft_ms": 5000, "tpot_ms": 500}})
    log = server_log(gw)
    assert "HFX scheduler: step-time profile loaded" in log
    assert "HFX scheduler: planning steps from each request's SLO" in log


def test_preemption_and_prefix_hits_under_hfx_scheduler_lose_no_request(gw):
    url = server(gw).url
    before = vllm_metrics(url)

    def ask(prompt: str, tokens: int = 100) -> int:
        r = gw.client.completions.create(
            model=gw.model, prompt=prompt, max_tokens=tokens,
            extra_body={"ignore_eos": True, "slo": {"ttft_ms": 60000, "tpot_ms": 5000}})
        return r.usage.completion_tokens

    # Eight distinct prompts of ~220 tokens growing by 300 each: any four decoding together
    # outgrow the 2,048 tokens of KV, however HFX's scheduler paces their prefills (with 100
    # more tokens each, the first ones could end before the last began: no preemption, 1 run
    # in 4).
    prompts = [f"{i}: tell me about the sea " * 10 for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda p: ask(p, 300), prompts)) == [300] * 8
    again = "the sea again " * 16
    assert ask(again) == ask(again) == 100  # the second finds the first's blocks cached
    after = vllm_metrics(url)
    assert after["vllm:num_preemptions_total"] > before.get("vllm:num_preemptions_total", 0)
    assert after["vllm:prefix_cache_hits_total"] > before.get("vllm:prefix_cache_hits_total", 0)
    assert "planning failed" not in server_log(gw)


def test_malformed_extra_arguments_and_structured_output_are_served(gw):
    url = server(gw).url
    bodies = [{"vllm_xargs": {"hfx_ttft_ms": "soon", "hfx_tpot_ms": -1}},
              {"vllm_xargs": {"hfx_ttft_ms": 1e300, "hfx_tpot_ms": 0}},
              {"vllm_xargs": {"hfx_tpot_ms": 1e-300}},
              {"structured_outputs": {"choice": ["yes", "no"]}}]
    for extra in bodies:
        r = httpx.post(f"{url}/v1/completions", timeout=120, json={
            "model": gw.model, "prompt": "is the sea wet?", "max_tokens": 4, **extra})
        assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("yes", "no")
    assert "planning failed" not in server_log(gw)


def test_a_client_that_leaves_is_aborted_and_the_server_goes_on(gw):
    url = server(gw).url
    slo = {"hfx_ttft_ms": 5000, "hfx_tpot_ms": 100}
    before = vllm_metrics(url).get("vllm:generation_tokens_total", 0.0)
    with httpx.stream("POST", f"{url}/v1/completions", timeout=60, json={
            "model": gw.model, "prompt": "a long story", "max_tokens": 600, "stream": True,
            "ignore_eos": True, "vllm_xargs": slo}) as r:
        next(line for line in r.iter_lines() if line.startswith("data: {"))

    def generated() -> float:
        return vllm_metrics(url).get("vllm:generation_tokens_total", 0.0)

    def settled() -> bool:
        count = generated()
        time.sleep(1.0)
        return generated() == count

    wait_for(settled, 60, "vLLM to drop the aborted request")
    assert generated() - before < 600  # aborted, not run to its end
    r = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": gw.model, "prompt": "still there?", "max_tokens": 3, "ignore_eos": True,
        "vllm_xargs": slo})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert "planning failed" not in server_log(gw)


# ---- the simulated vLLM against vLLM's own scheduler -----------------------------------------
def test_the_vllm_planner_steps_as_vllm_does_with_priorities_and_preemption(probed, vloop):
    """The probe's priority scenario, stock vLLM against HFX's ``vllm`` planner: the same
    tokens at every step, the same preemptions (vLLM's null block is not usable: 11 → 10)."""
    engine, ex = make_engine(num_blocks=10, block_size=16, planner="vllm",
                             max_num_batched_tokens=64, max_num_seqs=16, watermark=0.0)
    seqs = {}
    preempted: list[list[str]] = []

    async def scenario():
        for i in range(len(probed["priority"]["plans"])):
            for rid, prompt, out, priority, at in probed["priority"]["scenario"]:
                if at == i:
                    token = sum(map(ord, rid)) % 1000 + 1
                    seqs[rid] = s = seq(rid, prompt, out, prompt_token_ids=[token] * prompt,
                                        tpot=priority / 1e3)
                    engine.add_request(s)
            before = {r: s.num_preemptions for r, s in seqs.items()}
            await engine.step()
            preempted.append(sorted(r for r, s in seqs.items()
                                    if s.num_preemptions > before[r]))

    vloop.run_until_complete(scenario())
    real = probed["priority"]
    assert ["a"] in real["preempted"]  # the scenario preempts
    assert ex.plans == real["plans"]
    assert preempted == real["preempted"]
