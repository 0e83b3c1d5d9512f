"""hfx serve end to end: the official openai client, SLO inputs, bad inputs, disconnects, load."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from helpers.live import Running  # noqa: E402


@pytest.fixture(scope="module")
def gw():
    running = Running(instances=2)
    yield running
    running.close()


def test_completions_stream_and_not_agree(gw):
    r = gw.client.completions.create(model=gw.model, prompt="The cat", max_tokens=8,
                                     temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 7 and r.usage.completion_tokens == 8
    pieces = [c.choices[0].text for c in gw.client.completions.create(
        model=gw.model, prompt="The cat", max_tokens=8, temperature=0, stream=True)]
    assert "".join(pieces) == r.choices[0].text


def test_chat_stream_and_not_agree(gw):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = gw.client.chat.completions.create(model=gw.model, messages=messages, max_tokens=6,
                                          temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 6
    chunks = list(gw.client.chat.completions.create(
        model=gw.model, messages=messages, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6


def test_stop_strings_end_the_output_before_them(gw):
    full = gw.client.completions.create(model=gw.model, prompt="Once upon", max_tokens=24,
                                        temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    stop = next(text[i:i + 2] for i in range(6, len(text) - 2)
                if "\ufffd" not in text[:i + 2])  # two characters well inside the output
    want = text[:text.find(stop)]
    count = gw.server.metrics.count
    finished, aborted = count("default", "finished"), count("default", "aborted")
    whole = gw.client.completions.create(model=gw.model, prompt="Once upon", max_tokens=24,
                                         temperature=0, stop=[stop],
                                         extra_body={"ignore_eos": True})
    assert whole.choices[0].text == want and whole.choices[0].finish_reason == "stop"
    chunks = list(gw.client.completions.create(
        model=gw.model, prompt="Once upon", max_tokens=24, temperature=0, stop=[stop],
        stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"
    # Both ended on the stop string: served requests, with their latencies, not aborts.
    deadline = time.monotonic() + 10
    while count("default", "finished") < finished + 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (count("default", "finished"), count("default", "aborted")) == (finished + 2, aborted)


def test_models_health_metrics(gw):
    assert [m.id for m in gw.client.models.list()] == [gw.model]
    assert httpx.get(f"{gw.url}/health").json()["status"] == "ok"
    finished = ("hfx_requests_total", (("outcome", "finished"), ("task", "medical_qa")))
    ttfts = ("hfx_ttft_seconds_count", (("task", "medical_qa"),))
    tokens = ("hfx_generated_tokens_total", ())
    before = scrape(gw.url)
    gw.client.completions.create(model=gw.model, prompt="x", max_tokens=2,
                                 extra_body={"task": "medical_qa", "ignore_eos": True})
    deadline = time.monotonic() + 10
    while (after := scrape(gw.url)).get(finished, 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert after[finished] - before.get(finished, 0) == 1
    assert after[ttfts] - before.get(ttfts, 0) == 1
    assert after[tokens] - before[tokens] == 2
    assert after["hfx_in_flight_requests", ()] == 0 and after["hfx_queued_requests", ()] == 0
    kv = {dict(labels)["instance"] for name, labels in after if name == "hfx_instance_kv_usage"}
    assert kv == {"0", "1"}


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """/metrics parsed: (sample name, sorted labels) → value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _post(gw, body, headers=None) -> httpx.Response:
    # json.dumps writes NaN and Infinity as JavaScript does, as some clients send them.
    return httpx.post(f"{gw.url}/v1/completions", content=json.dumps(body),
                      headers={"content-type": "application/json", **(headers or {})},
                      timeout=30)


def test_slo_from_body_headers_priority_task_default(gw):
    base = {"model": gw.model, "prompt": "hello", "max_tokens": 2}
    r = _post(gw, {**base, "slo": {"ttft_ms": 1500, "tpot_ms": 300}})
    assert r.headers["x-hfx-slo-ttft-ms"] == "1500" and r.json()["slo"]["source"] == "body"
    r = _post(gw, base, {"x-slo-ttft-ms": "900", "x-slo-tpot-ms": "250"})
    assert r.headers["x-hfx-slo-tpot-ms"] == "250" and r.headers["x-hfx-slo-source"] == "header"
    r = _post(gw, {**base, "priority": 0})
    slo = r.json()["slo"]
    assert slo["source"] == "priority" and slo["ttft_ms"] > 0  # mapped by HFX-PM
    r = _post(gw, base, {"x-priority": "3"})
    assert r.json()["slo"]["priority"] == 3
    r = _post(gw, {**base, "task": "wikisql"})
    assert r.json()["slo"] == {"ttft_ms": 20000.0, "tpot_ms": 1000.0, "source": "task",
                               "priority": None, "task": "wikisql"}
    assert _post(gw, base).json()["slo"]["source"] == "default"


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"prompt": "x"}, 400, "model"),
    ({"model": "M", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "M", "prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ({"model": "M", "prompt": ""}, 400, "prompt"),
    ({"model": "M", "prompt": [1, 99999]}, 400, "token ids"),
    ({"model": "M", "prompt": "x" * 5000}, 400, "context length"),
    ({"model": "M", "prompt": "x", "slo": {"ttft_ms": 0.01, "tpot_ms": 100}}, 400,
     "impossible SLO"),
    ({"model": "M", "prompt": "x", "slo": {"ttft_ms": -1, "tpot_ms": 100}}, 400, "ttft_ms"),
    ({"model": "M", "prompt": "x", "priority": 9}, 400, "priority"),
    ({"model": "M", "prompt": "x", "task": "poetry"}, 400, "unknown task"),
    ({"model": "gpt-5", "prompt": "x"}, 404, "does not exist"),
    ({"model": "M", "prompt": "x", "seed": 2**64}, 400, "seed"),
    ({"model": "M", "prompt": "x", "temperature": float("nan")}, 400, "temperature"),
    ({"model": "M", "prompt": "x", "slo": {"ttft_ms": float("inf"), "tpot_ms": 100}}, 400,
     "ttft_ms"),
    ({"model": "M", "prompt": "x\ud800y"}, 400, "not valid Unicode"),
    ({"model": "M", "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ({"model": "M", "prompt": "x", "echo": True}, 400, "echo"),
    ({"model": "M", "prompt": "x", "n": 2}, 400, "n"),
])
def test_bad_input_is_a_4xx_and_the_server_goes_on(gw, body, status, needle):
    if body.get("model") == "M":
        body = {**body, "model": gw.model}
    r = _post(gw, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert needle in error["message"] and error["type"]
    assert _post(gw, {"model": gw.model, "prompt": "ok", "max_tokens": 1}).status_code == 200


def test_a_poison_sampling_request_is_served_and_breaks_nothing(gw):
    """Valid but extreme sampling values: top_p that keeps no token keeps the most
    likely one; the largest seed seeds a generator. Neither may take an instance down."""
    for extra in ({"top_p": 1e-300}, {"seed": 2**63 - 1, "temperature": 1.0}):
        r = _post(gw, {"model": gw.model, "prompt": "hello", "max_tokens": 2, **extra})
        assert r.status_code == 200, r.text
    greedy = _post(gw, {"model": gw.model, "prompt": "hello", "max_tokens": 4,
                        "temperature": 0}).json()["choices"][0]["text"]
    nucleus = _post(gw, {"model": gw.model, "prompt": "hello", "max_tokens": 4,
                         "temperature": 1.0, "top_p": 1e-300}).json()["choices"][0]["text"]
    assert nucleus == greedy
    assert len(gw.server.control.instances) == 2 and gw.server.control.num_instance_failures == 0


def test_an_empty_stop_string_is_ignored_in_either_form(gw):
    body = {"model": gw.model, "prompt": "The cat", "max_tokens": 6, "temperature": 0}
    plain = _post(gw, body).json()["choices"][0]
    for stop in ("", [""]):
        r = _post(gw, {**body, "stop": stop}).json()["choices"][0]
        assert (r["text"], r["finish_reason"]) == (plain["text"], plain["finish_reason"])


def test_malformed_json_and_bad_headers(gw):
    r = httpx.post(f"{gw.url}/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    r = _post(gw, {"model": gw.model, "prompt": "x"}, {"x-slo-ttft-ms": "soon",
                                                       "x-slo-tpot-ms": "1"})
    assert r.status_code == 400 and "milliseconds" in r.json()["error"]["message"]
    for bad in ("inf", "nan", "-5"):
        r = _post(gw, {"model": gw.model, "prompt": "x"}, {"x-slo-ttft-ms": bad,
                                                           "x-slo-tpot-ms": "100"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "slo", bad


def _idle(gw) -> bool:
    return all(e.kv.num_used_blocks == 0 and not e.has_work() for e in gw.engines())


def test_a_client_that_disconnects_frees_its_kv(gw):
    body = {"model": gw.model, "prompt": "long story", "max_tokens": 3000, "stream": True,
            "ignore_eos": True, "task": "wikisql"}
    with httpx.stream("POST", f"{gw.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert any(e.kv.num_used_blocks for e in gw.engines())
    deadline = time.monotonic() + 20
    while not _idle(gw):
        assert time.monotonic() < deadline, "the aborted request kept its KV"
        time.sleep(0.05)


def test_a_bounded_load_loses_no_request(gw):
    async def one(client: httpx.AsyncClient, i: int) -> dict:
        r = await client.post("/v1/completions", json={
            "model": gw.model, "prompt": f"request {i}", "max_tokens": 5 + i % 7,
            "ignore_eos": True, "task": "tldr_headline_gen"})
        assert r.status_code == 200, r.text
        return r.json()

    async def burst() -> list[dict]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(40)))

    results = asyncio.run(burst())
    assert [r["usage"]["completion_tokens"] for r in results] == [5 + i % 7 for i in range(40)]
    assert len({r["id"] for r in results}) == 40
    assert _idle(gw)


def test_sim_executor_serves_placeholder_text():
    running = Running(executor="sim", instances=1)
    try:
        r = running.client.completions.create(model=running.model, prompt="x", max_tokens=3)
        assert r.choices[0].text == " tok" * 3
        events = [json.loads(line[6:]) for line in httpx.post(
            f"{running.url}/v1/completions", json={"model": running.model, "prompt": "x",
                                                   "max_tokens": 2, "stream": True}
        ).text.splitlines() if line.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        running.close()


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_stream_interval_coalesces_tokens_into_fewer_chunks(route):
    running = Running(executor="sim", instances=1, stream_interval=4)
    try:
        body = {"model": running.model, "max_tokens": 10, "stream": True,
                **({"prompt": "x"} if route == "completions" else
                   {"messages": [{"role": "user", "content": "x"}]})}
        events = [json.loads(line[6:]) for line in httpx.post(
            f"{running.url}/v1/{route}", json=body, timeout=30).text.splitlines()
            if line.startswith("data: {")]

        def text(e: dict) -> str:
            c = e["choices"][0]
            return c["text"] if route == "completions" else c["delta"].get("content", "")

        # 10 tokens: chunks of 4, 4 and the 2 left, then the final chunk (empty text).
        assert [text(e) for e in events] == [" tok" * 4, " tok" * 4, " tok" * 2, ""]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        running.close()


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_return_token_ids_gives_each_event_its_token_and_the_whole_answer_all(route):
    """vLLM's extension, which a gateway in front (--engine openai) relays exact tokens by:
    one event per token with its id, the same ids as the whole answer, in order."""
    running = Running(instances=1)
    try:
        body = {"model": running.model, "max_tokens": 9, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True,
                **({"prompt": "hello"} if route == "completions" else
                   {"messages": [{"role": "user", "content": "hello"}]})}
        whole = httpx.post(f"{running.url}/v1/{route}", json=body, timeout=60).json()
        ids = whole["choices"][0]["token_ids"]
        assert len(ids) == whole["usage"]["completion_tokens"] == 9
        events = [json.loads(line[6:]) for line in httpx.post(
            f"{running.url}/v1/{route}", json={**body, "stream": True}, timeout=60
        ).text.splitlines() if line.startswith("data: {")]
        per_event = [e["choices"][0]["token_ids"] for e in events]
        assert [len(i) for i in per_event[:-1]] == [1] * 9  # then the final chunk: none left
        assert [t for i in per_event for t in i] == ids
        plain = httpx.post(f"{running.url}/v1/{route}",
                           json={**body, "return_token_ids": False}, timeout=60).json()
        assert "token_ids" not in plain["choices"][0]
    finally:
        running.close()


def test_hfx_bench_drives_a_live_server(tmp_path):
    from hfx.cli import main

    running = Running(executor="sim", instances=2, policy="hfx")
    try:
        out = tmp_path / "bench.json"
        assert main(["bench", "--target", running.url, "--workload", "four-task", "--qps", "20",
                     "--requests-per-task", "5", "--json", str(out)]) == 0
        result = json.loads(out.read_text())
        assert result["requests"] == 20 and result["finished"] == 20 and not result["errors"]
        assert set(result["per_task"]) == {"medical_qa", "tldr_content_gen",
                                           "tldr_headline_gen", "wikisql"}
        assert result["tpot"]["mean"] > 0 and result["attainment"] > 0
    finally:
        running.close()


def test_readiness_tells_the_truth_and_an_empty_fleet_answers_503_at_once():
    from fastapi.testclient import TestClient

    from hfx.config import ServeConfig
    from hfx.serving.build import build_server
    from hfx.serving.gateway import create_app

    server = build_server(ServeConfig(executor="sim", instances=1))
    with TestClient(create_app(server)) as client:
        r = client.get("/ready")
        assert r.status_code == 200 and r.json()["accepting"] == 1
        server.draining = True  # what the first SIGTERM sets (hfx.serving.gateway.serve)
        assert client.get("/ready").json()["reason"] == "shutting down"
        r = client.post("/v1/completions", json={"model": server.options.model_name,
                                                  "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
        server.draining = False
        client.portal.call(server.control.drain, 0)  # the last instance leaves
        r = client.get("/ready")
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["reason"] == "every instance has left"
        assert client.get("/health").status_code == 200  # alive all the same
        r = client.post("/v1/completions", json={"model": server.options.model_name,
                                                  "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "unavailable"


def test_a_non_streaming_client_that_goes_away_frees_its_kv(gw):
    body = {"model": gw.model, "prompt": "long story", "max_tokens": 3000, "ignore_eos": True,
            "task": "wikisql"}
    before = gw.server.metrics.count("wikisql", "aborted")
    with pytest.raises(httpx.TimeoutException):  # the client gives up and closes
        httpx.post(f"{gw.url}/v1/completions", json=body, timeout=1.0)
    deadline = time.monotonic() + 20
    while not _idle(gw):
        assert time.monotonic() < deadline, "the abandoned request kept running"
        time.sleep(0.05)
    assert gw.server.metrics.count("wikisql", "aborted") == before + 1


def _sim_client(**access):
    from fastapi.testclient import TestClient

    from hfx.config import ServeConfig
    from hfx.serving.build import build_server
    from hfx.serving.gateway import Access, create_app

    server = build_server(ServeConfig(executor="sim", instances=1))
    return TestClient(create_app(server, Access(**access))), server.options.model_name


def test_api_key_guards_v1_and_optionally_metrics_and_health():
    client, model = _sim_client(api_key="s3cret", auth_metrics=True)
    body = {"model": model, "prompt": "hi", "max_tokens": 2}
    with client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = client.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/v1/models").status_code == 401
        assert client.get("/metrics").status_code == 401  # auth_metrics
        assert client.get("/health").status_code == 200  # not guarded unless auth_health
        ok = {"Authorization": "Bearer s3cret"}
        assert client.post("/v1/completions", json=body, headers=ok).status_code == 200
        assert client.get("/metrics", headers=ok).status_code == 200


def test_a_body_over_the_limit_is_413_before_it_is_read_whole():
    client, model = _sim_client(max_body_bytes=2048)
    big = json.dumps({"model": model, "prompt": "x" * 4096, "max_tokens": 1}).encode()

    def chunked():  # no Content-Length: the limit is counted as the chunks arrive
        for i in range(0, len(big), 512):
            yield big[i:i + 512]

    with client:
        r = client.post("/v1/completions", content=big,
                        headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        r = client.post("/v1/completions", content=chunked(),
                        headers={"content-type": "application/json"})
        assert r.status_code == 413
        r = client.post("/v1/completions", json={"model": model, "prompt": "x",
                                                 "max_tokens": 1})
        assert r.status_code == 200  # under the limit: served


def test_cors_origins_are_allowed_only_when_configured():
    client, _ = _sim_client(cors_origins=("https://app.example",))
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    with client:
        r = client.options("/v1/completions", headers=preflight)
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = client.options("/v1/completions", headers={**preflight, "Origin": "https://evil"})
        assert "access-control-allow-origin" not in r.headers


def test_served_model_name_and_the_model_endpoint():
    client, model = _sim_client()
    assert "@" not in model  # a Hugging Face-style id by default
    with client:
        assert client.get(f"/v1/models/{model}").json()["id"] == model
        assert client.get("/v1/models/other").status_code == 404
    from fastapi.testclient import TestClient

    from hfx.config import ServeConfig
    from hfx.serving.build import build_server
    from hfx.serving.gateway import create_app

    server = build_server(ServeConfig(executor="sim", served_model_name="Qwen/Qwen2.5-7B"))
    with TestClient(create_app(server)) as named:
        assert named.get("/v1/models").json()["data"][0]["id"] == "Qwen/Qwen2.5-7B"
        assert named.get("/v1/models/Qwen/Qwen2.5-7B").status_code == 200
        r = named.post("/v1/completions", json={"model": "Qwen/Qwen2.5-7B", "prompt": "hi",
                                                 "max_tokens": 2, "logprobs": 0})
        assert r.status_code == 200  # the off form of an unsupported parameter is accepted


def test_a_long_prompt_is_tokenized_off_the_event_loop():
    import threading

    client, model = _sim_client()
    server = client.app.state.server
    seen: list[str] = []
    encode = server.encode

    def spy(prompt):
        seen.append(threading.current_thread().name)
        return encode(prompt)

    server.encode = spy
    with client:
        loop_thread = client.portal.call(lambda: threading.current_thread().name)
        client.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 1})
        r = client.post("/v1/completions", json={"model": model, "prompt": "x" * 20_000,
                                                  "max_tokens": 1})
        assert r.status_code == 400 and "context length" in r.json()["error"]["message"]
    assert seen[0] == loop_thread and seen[1] != loop_thread


def test_overload_is_shed_429_when_the_queue_is_full_503_when_it_waited_too_long():
    from fastapi.testclient import TestClient

    from hfx.config import ServeConfig
    from hfx.serving.build import build_server
    from hfx.serving.gateway import create_app

    server = build_server(ServeConfig(executor="sim", instances=1, max_queued=2, max_wait=0.0))
    prompt = [7] * 2000
    alone = server.step_model.prefill_one(len(prompt))
    # Only a request prefilled at once makes this TTFT; one behind another's prefill cannot.
    slo = {"ttft_ms": 1.3 * alone * 1e3, "tpot_ms": 500}
    body = {"model": server.options.model_name, "prompt": prompt, "max_tokens": 4,
            "slo": slo}

    async def burst() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://hfx") as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=body)
                                          for _ in range(8)))

    with TestClient(create_app(server)) as client:
        answers = client.portal.call(burst)
        metrics = client.get("/metrics").text
    codes = sorted(r.status_code for r in answers)
    full = [r for r in answers if r.status_code == 429]
    late = [r for r in answers if r.status_code == 503]
    assert codes[0] == 200 and set(codes) == {200, 429, 503}, codes
    assert {r.json()["error"]["code"] for r in full} == {"queue_full"}
    assert {r.json()["error"]["code"] for r in late} == {"shed"}
    assert all(r.headers["retry-after"] == "5" for r in full + late)
    assert f'hfx_requests_total{{outcome="shed",task="default"}} {len(full) + len(late)}' \
        in metrics
    assert "hfx_queued_requests 0" in metrics


def test_the_grafana_dashboard_queries_only_metrics_the_server_exports():
    import re
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    dashboard = json.loads((Path(__file__).parents[1] / "docs/grafana/hfx.json").read_text())
    wanted = {name for panel in dashboard["panels"] for target in panel["targets"]
              for name in re.findall(r"\bhfx_\w+", target["expr"])}
    client, model = _sim_client()
    with client:
        r = client.post("/v1/completions", json={"model": model, "prompt": "hi",
                                                  "max_tokens": 2})
        assert r.status_code == 200
        text = client.get("/metrics").text
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert len(wanted) >= 15 and wanted <= exported, sorted(wanted - exported)


@pytest.mark.parametrize("policy", ["slos-serve", "polyserve"])
def test_policies_whose_engines_pace_by_time_serve_on_the_real_engine(policy):
    # Their planners read the instance's step-time model: the serving profile, not the
    # executor's network (every step failed with "'CausalLM' object has no attribute").
    running = Running(instances=1, policy=policy, profile="tiny@cpu")
    try:
        r = running.client.completions.create(model=running.model, prompt="Hello",
                                              max_tokens=5, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
        assert running.engines()[0].planner.model is not None
    finally:
        running.close()


def test_a_failure_after_the_request_opened_is_still_a_json_500_and_the_request_ends(
        monkeypatch):
    from hfx.serving.gateway.generation import Generation

    client, model = _sim_client()

    def broken(self, events):
        raise RuntimeError("boom")

    monkeypatch.setattr(Generation, "feed", broken)
    with client:  # (a stream has sent its 200 by then: it ends, as any server's would)
        r = client.post("/v1/completions", json={"model": model, "prompt": "hi",
                                                 "max_tokens": 2})
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
        assert "boom" in r.json()["error"]["message"]
        server = client.app.state.server
        deadline = time.monotonic() + 10
        while server.control.records:  # aborted at the engine's next step, then forgotten
            assert time.monotonic() < deadline, "the failed request kept running"
            time.sleep(0.02)


def test_a_trailing_slash_reaches_the_completion_route():
    client, model = _sim_client()
    with client:
        r = client.post("/v1/completions/", json={"model": model, "prompt": "hi",
                                                  "max_tokens": 2})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def test_the_disconnect_watch_passes_over_other_messages_until_the_client_leaves():
    """A server may hand ``receive`` more than the disconnect after the body was read (an empty
    ``http.request``, as on pipelined or replayed input): the watch waits on, and the stream's
    reader hears the client leave only when it does."""
    from types import SimpleNamespace

    from hfx.serving.gateway.completions import _CLIENT_LEFT, Completions
    from hfx.serving.server import TokenQueue

    async def run() -> tuple[list, list]:
        messages: asyncio.Queue = asyncio.Queue()

        async def receive() -> dict:
            return await messages.get()

        stream = SimpleNamespace(queue=TokenQueue())
        watch = Completions(None)._watch(stream, receive)  # type: ignore[arg-type]
        messages.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        for _ in range(5):  # the watch takes the message and waits again
            await asyncio.sleep(0)
        early = list(stream.queue._items)
        messages.put_nowait({"type": "http.disconnect"})
        await watch
        await asyncio.sleep(0)
        return early, list(stream.queue._items)

    early, late = asyncio.run(run())
    assert early == [] and late == [_CLIENT_LEFT]
