"""``--engine openai``: any OpenAI-compatible server behind HFX.

Stand-ins for servers without vLLM's extras (text streams, no /health, no /metrics) and with
them, and a real ``hfx serve`` as the upstream: what each lacks is said at start, the tokens
and text come back exact, a broken stream resumes elsewhere in text mode too, and a server that
cannot serve (no token-id prompts) is refused at start, by name. The real vLLM server through
this backend is in tests/test_vllm.py's tier.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from helpers.fake_vllm import FakeVLLM, Served, generate  # noqa: E402
from helpers.live import Running, Tree  # noqa: E402

from hfx.config import ServeConfig  # noqa: E402
from hfx.model.build import write_random_checkpoint  # noqa: E402
from hfx.model.tokenizer import ByteTokenizer  # noqa: E402
from hfx.serving.build import build_server  # noqa: E402

TOKENS = 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_random_checkpoint("tiny", tmp_path_factory.mktemp("ckpt")))


def text_only(**kw) -> Served:
    """A server with none of vLLM's extras: text events, no /health, no /metrics."""
    return Served(FakeVLLM(seconds_per_token=0.005, token_ids=False, health_route=False,
                           metrics_route=False, **kw))


def gateway(checkpoint, urls, **kw) -> Running:
    return Running(engine="openai", checkpoint=checkpoint, backend=urls, profile="tiny@cpu",
                   max_model_len=2048, policy="rr", **kw)


def expected(prompt: str, n: int = TOKENS) -> str:
    return bytes(generate(ByteTokenizer().encode(prompt), n)).decode()


async def _complete(url: str, model: str, prompts: list[str], **extra) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async def one(prompt: str) -> dict:
            r = await client.post("/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": TOKENS, "ignore_eos": True,
                **extra})
            return {"status": r.status_code, **r.json()}

        return await asyncio.gather(*(one(p) for p in prompts))


def test_a_server_that_streams_text_alone_serves_exact_text_and_resumes_a_broken_stream(
        checkpoint, capsys):
    faults = {ord("!"): "drop"}  # the first server to get it drops it after a few tokens
    fakes = [text_only(faults=faults) for _ in range(2)]
    gw = gateway(checkpoint, [f.url for f in fakes])
    try:
        said = capsys.readouterr().out
        assert said.count("lacks, and HFX does without") == 2
        assert "no token ids in its stream" in said and "no /health" in said
        traits = gw.server.control.instances[0].traits
        assert (traits.token_ids, traits.health_path, traits.kv_blocks) == (
            False, "/v1/models", None)
        prompts = ["!faulty", "alpha", "beta", "gamma"]
        results = asyncio.run(_complete(gw.url, gw.model, prompts))
        assert not faults, "the fault was not triggered"
        for prompt, r in zip(prompts, results, strict=True):
            assert r["status"] == 200, r
            assert r["choices"][0]["text"] == expected(prompt)  # resumed exactly
            assert r["usage"]["completion_tokens"] == TOKENS
        assert gw.server.control.recovery.num_lost_resumed == 1
        body = fakes[0].fake.bodies[-1]
        # The standard fields and the one extension every such server takes; none of vLLM's.
        assert body["ignore_eos"] is True and isinstance(body["prompt"], list)
        assert not {"return_token_ids", "priority", "vllm_xargs", "stop_token_ids",
                    "slo"} & set(body)
    finally:
        gw.close()
        for f in fakes:
            f.stop()


def test_another_hfx_serve_gets_each_requests_slo_and_streams_token_ids(checkpoint):
    fake = Served(FakeVLLM(seconds_per_token=0.005, owned_by="hfx", metrics_route=False))
    gw = gateway(checkpoint, [fake.url])
    try:
        [r] = asyncio.run(_complete(gw.url, gw.model, ["alpha"],
                                    slo={"ttft_ms": 4000, "tpot_ms": 250}))
        assert r["choices"][0]["text"] == expected("alpha")
        body = fake.fake.bodies[-1]
        assert body["return_token_ids"] is True
        assert body["slo"]["tpot_ms"] == 250
        assert 0 < body["slo"]["ttft_ms"] <= 4000  # what is left of it when sent
    finally:
        gw.close()
        fake.stop()


def test_a_real_hfx_serve_behind_hfx_gives_the_tokens_it_gives_directly(checkpoint):
    upstream = Running(checkpoint=checkpoint, instances=1, profile="tiny@cpu")
    gw = gateway(checkpoint, [upstream.url])
    try:
        assert gw.model == upstream.model
        body = {"prompt": "hello there", "max_tokens": 12, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}
        direct = httpx.post(f"{upstream.url}/v1/completions",
                            json={"model": upstream.model, **body}, timeout=60).json()
        relayed = httpx.post(f"{gw.url}/v1/completions",
                             json={"model": gw.model, **body}, timeout=60).json()
        assert relayed["choices"][0]["token_ids"] == direct["choices"][0]["token_ids"]
        assert relayed["choices"][0]["text"] == direct["choices"][0]["text"]
        assert relayed["usage"]["completion_tokens"] == 12
    finally:
        gw.close()
        upstream.close()


def test_text_streams_through_front_processes(checkpoint):
    """With --api-workers 2 each front reads its streams and tokenizes their text itself."""
    fake = text_only()
    tree = Tree("--engine", "openai", "--backend", fake.url, "--checkpoint", checkpoint,
                "--profile", "tiny@cpu", "--max-model-len", "2048")
    try:
        results = asyncio.run(_complete(tree.url, tree.model, ["alpha", "beta"], stream=False))
        assert [r["choices"][0]["text"] for r in results] == [expected("alpha"),
                                                              expected("beta")]
    finally:
        tree.close()
        fake.stop()


def test_a_server_that_takes_no_token_id_prompts_is_refused_at_start_by_name(checkpoint):
    fake = text_only(token_prompts=False)
    try:
        with pytest.raises(ValueError, match=r"token-id prompt.*answered 400"):
            build_server(ServeConfig(engine="openai", checkpoint=checkpoint,
                                     backend=[fake.url], profile="tiny@cpu"))
    finally:
        fake.stop()


@pytest.mark.parametrize("options, message", [
    ({}, "give --backend URL"),
    ({"backend": ["http://127.0.0.1:9"], "mode": "pd", "prefill": 1, "decode": 1},
     "serves colocated"),
    ({"backend": ["http://127.0.0.1:9"], "max_instances": 2}, "drop --max-instances"),
    ({"backend": ["http://127.0.0.1:9"], "checkpoint": None}, "needs --checkpoint"),
    ({"backend": ["http://127.0.0.1:9"]}, "no answer to GET /v1/models"),
])
def test_what_the_openai_engine_cannot_do_stops_it_at_start(checkpoint, options, message):
    with pytest.raises(ValueError, match=message):
        build_server(ServeConfig(engine="openai", profile="tiny@cpu",
                                 **{"checkpoint": checkpoint, **options}))


def test_hfx_profile_measures_a_server_that_streams_text_alone(tmp_path):
    """A token per text event, and the client's own timing where there is no /metrics."""
    from hfx.cli import main
    from hfx.stepmodel.latency import load_profile

    fake = text_only()
    try:
        out = tmp_path / "p.json"
        assert main(["profile", "--engine", "openai", "--backend", fake.url, "--quick",
                     "--repeats", "1", "--out", str(out)]) == 0
        profile = load_profile(str(out))
        assert profile.name == "fake@openai"
        # The stand-in takes 5 ms a token whatever the batch: that is the decode step.
        assert profile.model.decode_time(64, 1) == pytest.approx(0.005, rel=0.5)
    finally:
        fake.stop()


@pytest.mark.parametrize("engine, options, flag", [
    ("openai", {"backend": ["http://127.0.0.1:9"], "vllm_args": "--enforce-eager"},
     "--vllm-args"),
    ("hfx", {"executor": "sim", "vllm_scheduler": "stock"}, "--vllm-scheduler"),
])
def test_a_setting_of_another_engine_is_refused_not_ignored(checkpoint, engine, options, flag):
    with pytest.raises(ValueError, match=f"{flag} is a setting of --engine vllm"):
        build_server(ServeConfig(engine=engine, checkpoint=checkpoint, profile="tiny@cpu",
                                 **options))
