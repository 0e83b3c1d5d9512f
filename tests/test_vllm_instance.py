"""HFX over vLLM servers, in the fast suite: VLLMInstance against a stand-in server
(tests/helpers/fake_vllm.py) through the real gateway and control plane. What is sent (token ids,
priority, request id), tokens back, abort on disconnect, a server that dies, an error chunk.
The same against real vLLM is tests/test_vllm.py (marker ``vllm``)."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from helpers.fake_vllm import DropsFirstPost, FakeVLLM, Served, generate  # noqa: E402
from helpers.live import Running  # noqa: E402

from hfx.backends.vllm.instance import vllm_priority  # noqa: E402
from hfx.backends.vllm.metrics import parse_metrics  # noqa: E402
from hfx.engine.planners.vllm import BEST_EFFORT_PRIORITY  # noqa: E402
from hfx.model.build import write_random_checkpoint  # noqa: E402
from hfx.request import SLO, Request  # noqa: E402

VLLM_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 41.0
""" + ('vllm:cache_config_info{block_size="32",num_cpu_blocks="None",'
       'skip_layers="[1, 2]",num_gpu_blocks="512"} 1.0\n')  # a label value with a comma


def test_parse_metrics_reads_vllm_gauges_and_cache_labels():
    m = parse_metrics(VLLM_PAGE)
    assert m["vllm:num_requests_running"] == 3 and m["vllm:num_requests_waiting"] == 2
    assert m["vllm:kv_cache_usage_perc"] == 0.25
    assert m["cache_config_info.num_gpu_blocks"] == 512
    assert m["cache_config_info.block_size"] == 32
    assert "cache_config_info.num_cpu_blocks" not in m  # "None" is no number


def test_priority_is_tpot_order_with_best_effort_last():
    def req(tpot):
        return Request("r", 0.0, 8, 4, slo=SLO(1.0, tpot))

    assert vllm_priority(req(0.05), False) == 50
    assert vllm_priority(req(0.05), False) < vllm_priority(req(0.2), False)
    assert vllm_priority(req(0.05), True) == BEST_EFFORT_PRIORITY


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_random_checkpoint("tiny", tmp_path_factory.mktemp("ckpt")))


def gateway(checkpoint, fakes, **kw) -> Running:
    return Running(engine="vllm", checkpoint=checkpoint, backend=[f.url for f in fakes],
                   instances=len(fakes), profile="tiny@cpu", max_model_len=2048, **kw)


@pytest.fixture(scope="module")
def fleet(checkpoint):
    fakes = [Served(FakeVLLM()), Served(FakeVLLM())]
    gw = gateway(checkpoint, fakes, policy="rr")
    yield gw, fakes
    gw.close()
    for f in fakes:
        f.stop()


def new_bodies(fakes, before):
    return [f.fake.bodies[n:] for f, n in zip(fakes, before, strict=True)]


def test_a_request_reaches_vllm_as_token_ids_with_its_priority_and_id(fleet):
    gw, fakes = fleet
    before = [len(f.fake.bodies) for f in fakes]
    r = gw.client.completions.create(model=gw.model, prompt="The cat", max_tokens=6,
                                     extra_body={"slo": {"ttft_ms": 3000, "tpot_ms": 80},
                                                 "ignore_eos": True})
    (body,) = [b for sent in new_bodies(fakes, before) for b in sent]
    prompt = list(b"The cat")  # tokenized once, by HFX's tokenizer (the byte one here)
    assert body["prompt"] == prompt
    assert body["priority"] == 80  # the TPOT SLO in ms: HyperFlexis's Q_R order
    # For HFX's scheduler in the server: the TTFT left when sent, and the TPOT.
    assert body["vllm_xargs"]["hfx_tpot_ms"] == 80
    assert 2000 < body["vllm_xargs"]["hfx_ttft_ms"] <= 3000
    assert body["return_token_ids"] and body["stream"] and body["ignore_eos"]
    assert body["max_tokens"] == 6 and body["stop_token_ids"] == []
    assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
    assert r.choices[0].text == bytes(generate(prompt, 6)).decode()
    headers = [h for f in fakes for h in f.fake.headers]
    assert headers[-1]["x-request-id"].startswith("cmpl-")


def test_the_eos_stops_at_vllm_unless_ignored(fleet):
    gw, fakes = fleet
    before = [len(f.fake.bodies) for f in fakes]
    gw.client.completions.create(model=gw.model, prompt="Hi", max_tokens=3)
    (body,) = [b for sent in new_bodies(fakes, before) for b in sent]
    assert body["stop_token_ids"] == [256] and not body["ignore_eos"]


def test_round_robin_spreads_over_both_servers(fleet):
    gw, fakes = fleet
    before = [len(f.fake.bodies) for f in fakes]
    for _ in range(4):
        gw.client.completions.create(model=gw.model, prompt="x", max_tokens=2)
    assert [len(sent) for sent in new_bodies(fakes, before)] == [2, 2]


def wait_for(cond, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_that_disconnects_aborts_the_request_at_vllm(fleet):
    gw, fakes = fleet
    body = {"model": gw.model, "prompt": "long", "max_tokens": 1500, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{gw.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        assert sum(len(f.fake.running) for f in fakes) == 1
    wait_for(lambda: sum(len(f.fake.running) for f in fakes) == 0)
    assert sum(len(f.fake.cancelled) for f in fakes) == 1  # vLLM saw the connection close
    wait_for(lambda: gw.server.metrics.count("default", "aborted") == 1)


def test_an_error_chunk_fails_that_request_alone(checkpoint):
    fakes = [Served(FakeVLLM(fail_prompts_with=ord("!")))]
    gw = gateway(checkpoint, fakes)
    try:
        bad = httpx.post(f"{gw.url}/v1/completions", timeout=30,
                         json={"model": gw.model, "prompt": "!boom", "max_tokens": 4})
        assert bad.status_code == 500
        assert "EngineCore encountered an issue" in bad.json()["error"]["message"]
        ok = gw.client.completions.create(model=gw.model, prompt="fine", max_tokens=4)
        assert ok.usage.completion_tokens == 4
        assert gw.server.control.num_instance_failures == 0
    finally:
        gw.close()
        fakes[0].stop()


def test_a_connection_closed_before_any_answer_is_sent_again_not_an_instance_failure(checkpoint):
    served = Served(FakeVLLM())
    relay = DropsFirstPost(served.url)
    gw = Running(engine="vllm", checkpoint=checkpoint, backend=[relay.url], instances=1,
                 profile="tiny@cpu", max_model_len=2048)
    try:
        r = gw.client.completions.create(model=gw.model, prompt="The cat", max_tokens=6)
        assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
        assert relay.dropped == 1 and len(served.fake.bodies) == 1  # vLLM saw it once
        assert gw.server.control.num_instance_failures == 0
    finally:
        gw.close()
        served.stop()


PROMPTS = ("first", "second")


def test_a_server_that_dies_fails_over_and_its_requests_resume(checkpoint):
    fakes = [Served(FakeVLLM(seconds_per_token=0.01)), Served(FakeVLLM(seconds_per_token=0.01))]
    gw = gateway(checkpoint, fakes, policy="rr")
    try:
        async def run():
            client = httpx.AsyncClient(base_url=gw.url, timeout=60)

            async def one(prompt):
                r = await client.post("/v1/completions", json={
                    "model": gw.model, "prompt": prompt, "max_tokens": 200,
                    "ignore_eos": True})
                return r.json()

            tasks = [asyncio.create_task(one(p)) for p in PROMPTS]
            while not all(f.fake.running for f in fakes):  # one on each server
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            await asyncio.to_thread(fakes[0].die)
            out = await asyncio.gather(*tasks)
            await client.aclose()
            return out

        results = asyncio.run(run())
        assert [r["usage"]["completion_tokens"] for r in results] == [200, 200]
        assert [r["choices"][0]["finish_reason"] for r in results] == ["length", "length"]
        control = gw.server.control
        assert control.num_instance_failures == 1 and control.num_resumed == 1
        # The survivor got the continuation: the prompt plus the tokens already streamed.
        resumed = fakes[1].fake.bodies[-1]
        first = fakes[0].fake.bodies[0]["prompt"]
        assert resumed["prompt"][:len(first)] == first and len(resumed["prompt"]) > len(first)
        assert resumed["max_tokens"] == 200 - (len(resumed["prompt"]) - len(first))
        # The text stayed whole, as if nothing had happened: what the dead server streamed,
        # then the survivor's continuation. (The two requests race to the gateway, so either
        # may have been the one on the server that died.)
        victim = PROMPTS.index(bytes(first).decode())
        assert results[victim]["choices"][0]["text"] == bytes(generate(first, 200)).decode()
        assert not gw.server.readiness()["ready"] or gw.server.readiness()["accepting"] == 1
    finally:
        gw.close()
        fakes[1].stop()


def test_pd_prefills_on_one_server_and_decodes_on_the_other(checkpoint):
    prefill, decode = Served(FakeVLLM()), Served(FakeVLLM())
    gw = gateway(checkpoint, [prefill, decode], mode="pd", prefill=1, decode=1)
    try:
        r = gw.client.completions.create(model=gw.model, prompt="Split me", max_tokens=12,
                                         extra_body={"slo": {"ttft_ms": 3000, "tpot_ms": 90},
                                                     "ignore_eos": True})
        prompt = list(b"Split me")
        want = generate(prompt, 12)
        assert r.choices[0].text == bytes(want).decode()  # as colocated
        (first,) = prefill.fake.bodies
        assert first["prompt"] == prompt and first["max_tokens"] == 1
        (rest,) = decode.fake.bodies
        # The prompt and the first token (the KV connector loads the prompt's KV there).
        assert rest["prompt"] == prompt + want[:1] and rest["max_tokens"] == 11
        assert rest["priority"] == 90
        assert gw.server.control.instances[0].stats().num_held == 0  # migrated, let go
        # A one-token request ends on the prefill instance.
        one = gw.client.completions.create(model=gw.model, prompt="One", max_tokens=1)
        assert one.usage.completion_tokens == 1 and len(decode.fake.bodies) == 1
    finally:
        gw.close()
        prefill.stop()
        decode.stop()


def test_decode_step_is_a_rate_that_coalesced_chunks_do_not_fool():
    from hfx.backends.vllm.profiler import decode_step

    # Two requests decoding at 20 ms a step, whose tokens the server sends in threes (its HTTP
    # side lags the engine); the second one's first token comes last, at 0.07 s.
    a = [0.01, 0.07, 0.07, 0.07, 0.13, 0.13, 0.13, 0.19, 0.19, 0.19]
    b = [0.07, 0.13, 0.13, 0.13, 0.19, 0.19, 0.19]
    assert decode_step([a, b]) == pytest.approx(0.02)
    # Single gaps would say 0 (two in three are 0); counting the first chunk, 15 ms.
    # A request that ended before the last one started does not count, and does not break it.
    assert decode_step([[0.0, 0.01, 0.02], [0.05, 0.07, 0.09]]) == pytest.approx(0.02)
    # Every token in one chunk: only the bound from sending (at 0) is left.
    assert decode_step([[0.3, 0.3, 0.3]], sent=0.0) == pytest.approx(0.1)


def test_the_scalers_log_says_how_a_vllm_server_comes_up_not_a_modelled_weight_path():
    from hfx.backends.vllm.process import VLLMPlacement
    from hfx.cluster.provisioner import Plan

    placement = VLLMPlacement(None, ("http://127.0.0.1:1",))
    plan = Plan("d2d", 4.2, warm=False, fell_back=False)
    assert placement.describe_launch(plan) == \
        "a cold vLLM server: a process start and its own weight load"
    placement.warm = [object(), object()]  # type: ignore[list-item]
    assert placement.describe_launch(plan) == "a warm vLLM server (2 in the pool)"


def test_the_profiler_sends_a_request_again_when_its_connection_broke_before_any_answer():
    from hfx.backends.vllm.profiler import VLLMGrid, measure

    served = Served(FakeVLLM(seconds_per_token=0.001))
    relay = DropsFirstPost(served.url)
    try:
        grid = VLLMGrid(prefill_batches=(1,), decode_batches=(2,), lengths=(16,), repeats=1)
        model, prefill, decode = asyncio.run(measure([relay.url], grid, 100_000))
        assert model == "fake" and len(prefill) == 1 and len(decode) == 1
        # The warm-up's POST was dropped before the server saw it; sent again, it got through.
        assert relay.dropped == 1 and len(served.fake.bodies) == 1 + 1 + 2
    finally:
        served.stop()


def test_a_request_broken_on_a_kept_connection_is_sent_again_on_a_new_one_not_a_kept_one():
    # Connections opened together reach vLLM's keep-alive limit together: when the one a
    # request went out on breaks, the pool's other kept one would break the same way.
    from hfx.backends.vllm.metrics import vllm_client, vllm_stream

    served = Served(FakeVLLM(seconds_per_token=0.001))
    relay = DropsFirstPost(served.url, drops=2, reused_only=True)
    body = {"model": "fake", "prompt": [5, 6], "max_tokens": 2, "stream": True,
            "return_token_ids": True}

    async def send(client: httpx.AsyncClient) -> str:
        async with vllm_stream(client, f"{relay.url}/v1/completions", json=body) as response:
            return (await response.aread()).decode()

    async def run() -> list[str]:
        async with vllm_client(10.0) as client:
            await asyncio.gather(send(client), send(client))  # two connections, both kept
            return [await send(client)]

    try:
        [text] = asyncio.run(run())
        assert "[DONE]" in text
        assert relay.dropped == 1 and len(served.fake.bodies) == 3
    finally:
        served.stop()


class _StartingServer:
    """A stand-in server whose start-up goes as ``outcomes`` says, one per server made."""

    def __init__(self, outcomes: list[str], made: list[_StartingServer], index: int) -> None:
        self.outcome = outcomes.pop(0)
        self.index = index
        self.killed = False
        made.append(self)

    def start(self) -> _StartingServer:
        return self

    def wait_ready_blocking(self) -> None:
        from hfx.backends.vllm.process import ServerStartError

        if self.outcome != "ready":
            raise ServerStartError(f"server {self.index}: {self.outcome}",
                                   exited=self.outcome == "exited")

    def kill(self) -> None:
        self.killed = True


@pytest.mark.parametrize(("outcomes", "made", "raised"), [
    (["exited", "ready"], 2, None),  # started again on the first failure
    (["exited", "exited"], 2, "exited"),  # once only
    (["slow"], 1, "slow"),  # not ready in time: not started again (it would wait as long)
])
def test_a_server_that_exits_during_the_fleets_start_is_started_once_more(outcomes, made,
                                                                         raised):
    from types import SimpleNamespace

    from hfx.backends.vllm.process import ServerStartError, VLLMPlacement

    servers: list[_StartingServer] = []
    placement = VLLMPlacement(SimpleNamespace(max_num_seqs=4),  # type: ignore[arg-type]
                              new_server=lambda launch, i, n: _StartingServer(outcomes, servers,
                                                                              i))
    first = placement.new_server(placement.spec, 3, 4).start()
    if raised is None:
        assert placement._ready(first, 3, 4) is servers[-1]
    else:
        with pytest.raises(ServerStartError, match=raised):
            placement._ready(first, 3, 4)
    assert len(servers) == made and [s.index for s in servers] == [3] * made
    assert [s.killed for s in servers[:-1]] == [True] * (made - 1)  # the failed one stopped


def test_a_failed_start_shows_the_logs_first_traceback_as_well_as_its_tail():
    """vLLM's engine core fails first and the API server's traceback follows: the tail alone
    hid the root cause (a CI run showed only the API server's side)."""
    from hfx.backends.vllm.process import failure_excerpt

    log = ("INFO starting\nTraceback (most recent call last):\n  File \"core.py\"\n"
           "ValueError: the root cause\n" + "api server traceback\n" * 400)
    excerpt = failure_excerpt(log)
    assert "ValueError: the root cause" in excerpt
    assert excerpt.endswith("api server traceback\n") and "INFO starting" not in excerpt
    assert failure_excerpt("a short log") == "a short log"  # all of it in the tail
