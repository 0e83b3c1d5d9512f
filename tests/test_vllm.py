"""HFX over real vLLM servers: the ``vllm`` tier, which ``.ci/run`` runs after the
README's suite (``pytest -m vllm``; the README's own run deselects it).

Two vLLM CPU servers start once for the module from a random-weight ``mini`` checkpoint (the
smallest shape vLLM's CPU attention takes) and serve behind the real gateway: SLO dispatch,
greedy output against ``transformers`` on the same weights, abort on disconnect, a killed
server whose requests resume while the Scaler starts its replacement, and the dispatcher's
step-time model calibrated on what the servers served. vLLM lives where
``HFX_VLLM_PYTHON`` points (its own environment: its pins are not ours), or in this one.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytestmark = pytest.mark.vllm

from helpers.vllm_tier import (  # noqa: E402  (skips without vLLM)
    ARGS,
    PYTHON,
    leave_mid_stream,
    vllm_metrics,
    wait_for,
)

# isort: split
import httpx  # noqa: E402
from helpers.live import Running, Tree  # noqa: E402

from hfx.engine import Role  # noqa: E402
from hfx.model.tokenizer import ByteTokenizer  # noqa: E402
from hfx.workloads.traces import RECORD_OUTCOMES  # noqa: E402


@pytest.fixture(scope="module")
def gw(mini_checkpoint):
    # One warm server beside the two; the Scaler's indicators are off (ratios out of reach):
    # it only replaces what fails, and scales out when asked.
    running = Running(engine="vllm", checkpoint=mini_checkpoint, instances=2, max_instances=3,
                      warm_pool=1, scale_out_ratio=1e9, wait_threshold=1e9,
                      vllm_python=PYTHON, vllm_args=ARGS, kv_capacity_tokens=16384,
                      max_model_len=2048, policy="hfx", max_wait=None)
    yield running
    running.close()


def backends(gw) -> list:
    return list(gw.server.control.instances.values())


def finished_at_vllm(gw) -> float:
    return sum(vllm_metrics(b.url).get("vllm:request_success_total", 0) for b in backends(gw))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_requests_with_slos_are_served_by_vllm(gw):
    assert [type(b).__name__ for b in backends(gw)] == ["VLLMInstance"] * 2
    before = finished_at_vllm(gw)
    slos = [(1000, 50), (5000, 200), None, None]
    for i, slo in enumerate(slos):
        extra: dict = {"ignore_eos": True}
        if slo is not None:
            extra["slo"] = {"ttft_ms": slo[0], "tpot_ms": slo[1]}
        elif i == 2:
            extra["task"] = "sharegpt"
        r = gw.client.completions.create(model=gw.model, prompt=f"request {i}", max_tokens=8,
                                         extra_body=extra)
        assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
        applied = r.model_extra["slo"]
        want = {0: (1000, 50, "body"), 1: (5000, 200, "body"), 2: (2000, 500, "task"),
                3: (2000, 500, "default")}[i]
        assert (applied["ttft_ms"], applied["tpot_ms"], applied["source"]) == want
        assert r.model_extra["timing"]["ttft_ms"] > 0
    assert finished_at_vllm(gw) - before == 4  # vLLM ran them, not HFX's own engine


def test_greedy_output_equals_transformers_on_the_same_weights(gw, mini_checkpoint):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(mini_checkpoint,
                                                              torch_dtype=torch.float32)
    tok = ByteTokenizer()
    for prompt in ("The quick brown fox", "Once upon a time"):
        ids = torch.tensor([tok.encode(prompt)])
        want = model.generate(ids, max_new_tokens=16, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].tolist()
        r = gw.client.completions.create(model=gw.model, prompt=prompt, max_tokens=16,
                                         temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].text == tok.decode(want)


def test_a_client_that_disconnects_stops_the_request_at_vllm(gw):
    """A client that leaves mid-stream: HFX aborts the record and closes its stream to vLLM,
    and vLLM's engine stops generating, far short of ``max_tokens`` (issue 28: never
    skipped; ``leave_mid_stream`` says why an attempt may be tried again)."""
    body = {"model": gw.model, "prompt": "a long one", "max_tokens": 2000, "stream": True,
            "ignore_eos": True}

    def ended() -> dict[str, int]:
        return {o: n for o in RECORD_OUTCOMES if (n := gw.server.metrics.count("default", o))}

    def generated() -> float:
        return sum(vllm_metrics(b.url).get("vllm:generation_tokens_total", 0)
                   for b in backends(gw))

    tried = leave_mid_stream(f"{gw.url}/v1/completions", body, ended, generated,
                             closed=lambda: not any(b.in_flight() for b in backends(gw)))
    assert tried[-1]["outcome"] == "aborted" and tried[-1]["generated"] < 2000


def test_two_front_processes_relay_real_vllm_and_abort_it(gw, mini_checkpoint):
    """Issue 28: ``--api-workers 2`` over the same servers: the fronts read vLLM's streams
    themselves. The text is the one-process gateway's; a client that leaves stops vLLM."""
    urls = [b.url for b in backends(gw)]
    tree = Tree("--engine", "vllm", "--checkpoint", mini_checkpoint, "--profile", "tiny@cpu",
                "--calibrate-every", "0", "--max-model-len", "2048", "--policy", "rr",
                *[a for u in urls for a in ("--backend", u)])
    try:
        prompt = "The tree relays"
        want = gw.client.completions.create(model=gw.model, prompt=prompt, max_tokens=24,
                                            temperature=0, extra_body={"ignore_eos": True})
        got = httpx.post(f"{tree.url}/v1/completions", timeout=120, json={
            "model": tree.model, "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True}).json()
        assert got["choices"][0]["text"] == want.choices[0].text
        assert got["usage"]["completion_tokens"] == 24

        def generated() -> float:
            return sum(vllm_metrics(u).get("vllm:generation_tokens_total", 0) for u in urls)

        def ended() -> dict[str, int]:  # the control process counts what its fronts served
            return {o: n for o in RECORD_OUTCOMES
                    if (n := int(tree.metric(f'hfx_requests_total{{outcome="{o}",'
                                             f'task="default"}}')))}

        body = {"model": tree.model, "prompt": "a long one", "max_tokens": 2000,
                "stream": True, "ignore_eos": True}
        tried = leave_mid_stream(f"{tree.url}/v1/completions", body, ended, generated)
        assert tried[-1]["outcome"] == "aborted" and tried[-1]["generated"] < 2000
    finally:
        tree.close()


def test_the_openai_engine_serves_vllm_as_any_openai_server(gw, mini_checkpoint):
    """Issue 51: the generic backend over the same servers. Its probe finds vLLM's extras
    (token ids; the KV size from /metrics); the text is the vllm engine's, streamed as token
    ids and, with those turned off, as text tokenized at the gateway."""
    import dataclasses

    urls = [b.url for b in backends(gw)]
    generic = Running(engine="openai", checkpoint=mini_checkpoint, backend=urls,
                      profile="tiny@cpu", max_model_len=2048, policy="rr")
    try:
        instances = list(generic.server.control.instances.values())
        assert [type(i).__name__ for i in instances] == ["OpenAIInstance"] * 2
        traits = instances[0].traits
        assert (traits.token_ids, traits.health_path) == (True, "/health")
        assert instances[0].info.kv_total_blocks == backends(gw)[0].info.kv_total_blocks
        prompt = "Any server will do"
        want = gw.client.completions.create(model=gw.model, prompt=prompt, max_tokens=24,
                                            temperature=0, extra_body={"ignore_eos": True})

        def relayed() -> dict:
            return httpx.post(f"{generic.url}/v1/completions", timeout=120, json={
                "model": generic.model, "prompt": prompt, "max_tokens": 24,
                "temperature": 0, "ignore_eos": True}).json()

        got = relayed()
        assert got["choices"][0]["text"] == want.choices[0].text
        assert got["usage"]["completion_tokens"] == 24
        for inst in instances:  # as a server that streams text alone
            inst.traits = dataclasses.replace(inst.traits, token_ids=False)
        assert relayed()["choices"][0]["text"] == want.choices[0].text
    finally:
        generic.close()


def test_a_killed_vllm_server_resumes_its_requests_and_a_warm_one_replaces_it(gw):
    control = gw.server.control
    (warm,) = gw.server.placement.warm
    # Freeze a server that is streaming to HFX (SIGSTOP on its group: API server and engine
    # core), let HFX read what the server had already written, and kill it only while one of
    # HFX's requests there is still short of its tokens: its finish never left the server, so
    # it must resume. vLLM's counters cannot pick that moment: its engine runs far ahead of its
    # front end (it had counted all 1800 tokens before HFX had its first, in CI), and its gauges
    # are stale once the engine goes idle. The policy decides where the other request runs.
    def streaming() -> list:
        return [b for b in backends(gw) if any(0 < n < 1800 for n in b.in_flight().values())]

    def read_all(b) -> bool:
        seen = b.in_flight()
        time.sleep(1.0)
        return b.in_flight() == seen

    def start_pair() -> tuple[list, list[threading.Thread]]:
        results: list = [None, None]

        def one(i: int) -> None:
            results[i] = httpx.post(f"{gw.url}/v1/completions", timeout=300, json={
                "model": gw.model, "prompt": f"survive {i}", "max_tokens": 1800,
                "ignore_eos": True}).json()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        return results, threads

    # vLLM's front end can also hand a whole output over in one chunk (see leave_mid_stream):
    # a pair that finished before any of it was caught short proves nothing, so another starts.
    victim, tried = None, []
    while victim is None:
        assert len(tried) < 4, ("no request caught streaming", tried)
        results, threads = start_pair()
        while victim is None and any(t.is_alive() for t in threads):
            found = streaming()
            if not found:
                time.sleep(0.05)
                continue
            b = found[0]
            os.killpg(b.process.pid, signal.SIGSTOP)
            wait_for(lambda b=b: read_all(b), 30, "HFX to read what the frozen server wrote")
            if b.in_flight():
                victim = b
            else:  # everything it owed had been written already: let it go on, try again
                os.killpg(b.process.pid, signal.SIGCONT)
        if victim is None:
            tried.append(results)
    held = len(victim.in_flight())
    others = {b.id for b in backends(gw)}
    os.kill(victim.process.pid, signal.SIGKILL)
    os.killpg(victim.process.pid, signal.SIGCONT)  # its engine core sees its parent gone
    for t in threads:
        t.join(timeout=300)
    assert [r.get("usage", {}).get("completion_tokens") for r in results] == [1800, 1800], \
        results
    assert control.num_instance_failures == 1
    # What vLLM was generating resumed; one it had finished may have reached HFX whole.
    assert 1 <= control.num_resumed <= held <= 2
    # The Scaler replaces it with the warm server: already started, no process start.
    wait_for(lambda: len(control.instances) == 2
             and all(control.accepting(i) for i in control.instances), 60, "a replacement")
    assert victim.id not in control.instances
    (new,) = [b for b in backends(gw) if b.id not in others]
    assert new.process is warm and not gw.server.placement.warm
    wait_for(lambda: not group_alive(victim.process.pid), 30, "the killed server's engine to go")
    r = gw.client.completions.create(model=gw.model, prompt="after", max_tokens=4,
                                     extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4


def test_scale_out_with_no_warm_server_starts_one(gw):
    control = gw.server.control
    before = set(control.instances)
    iid = gw.call(lambda: control.scaler.scale_out_now(Role.COLOCATED))
    assert iid is not None and iid not in before
    wait_for(lambda: iid in control.instances and control.accepting(iid), 300, "a cold start")
    started = control.instances[iid]
    assert type(started).__name__ == "VLLMInstance" and started.process.alive()
    assert gw.call(lambda: control.scaler.scale_out_now(Role.COLOCATED)) is None  # at max
    # Its server answers (HFX dispatching to any instance is what the tests above show).
    r = httpx.post(f"{started.url}/v1/completions", timeout=60, json={
        "model": started.info.model, "prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_the_dispatcher_is_calibrated_on_what_vllm_served(gw):
    # Last in the module: a fit changes the model every later decision plans with.
    from concurrent.futures import ThreadPoolExecutor

    from hfx.serving.calibrator import SCALE_RANGE

    server = gw.server
    calibrator = server.calibrator
    assert calibrator is not None and calibrator.every == 60.0  # on by default
    # Its own round below, not the periodic one: the module runs for minutes, and a periodic
    # fit between the requests and the call would leave this one nothing new to fit on.
    gw.call_async(calibrator.stop)
    rounds = calibrator.rounds
    before = calibrator.new  # the window (``served``) is capped; this count is not
    base = server.control.step_model

    def one(i: int) -> int:
        r = gw.client.completions.create(model=gw.model, prompt=f"calibrate {i} " * (1 + i % 9),
                                         max_tokens=24 + i % 17, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(one, range(48))) == sorted(24 + i % 17 for i in range(48))
    # Every stream that ended was observed, with the instance and times vLLM served it at.
    wait_for(lambda: calibrator.new >= before + 48, 30, "48 served requests observed",
             lambda: f"{calibrator.new - before} observed")
    assert {s.instance for s in calibrator.served} <= set(server.control.instances) | set(
        server.control.retired)
    fit = gw.call_async(calibrator.calibrate, timeout=120)
    assert fit is not None and calibrator.rounds == rounds + 1 and fit.decode_scale > 0
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    if SCALE_RANGE[0] <= fit.decode_scale <= SCALE_RANGE[1]:
        assert calibrator.last is fit
        assert server.control.step_model == fit.apply(calibrator.base)
        assert f"hfx_step_model_decode_scale {fit.decode_scale}" in text
    else:  # this machine's streams made no sense of the profile: logged, not applied
        assert calibrator.last is not fit and server.control.step_model == base
        in_force = calibrator.last.decode_scale if calibrator.last is not None else 1.0
        assert f"hfx_step_model_decode_scale {in_force}" in text
