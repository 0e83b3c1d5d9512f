"""An upstream's fault costs the request, not the fleet.

Two stand-in vLLM servers behind the real gateway; one stream misbehaves on cue while healthy
streams run beside it. The faulty request resumes on a server and finishes whole, every healthy
stream finishes whole, and both servers still serve afterwards. A server whose health check
fails too leaves the fleet, and is re-admitted once it is healthy again.
"""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from helpers.fake_vllm import FakeVLLM, Served, generate  # noqa: E402
from helpers.live import Running  # noqa: E402

from hfx.config import ServeConfig  # noqa: E402
from hfx.model.build import write_random_checkpoint  # noqa: E402
from hfx.model.tokenizer import ByteTokenizer  # noqa: E402

TOKENS = 30
HEALTHY = ("alpha", "beta", "gamma", "delta")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_random_checkpoint("tiny", tmp_path_factory.mktemp("ckpt")))


def gateway(checkpoint, fakes, **kw) -> Running:
    return Running(engine="vllm", checkpoint=checkpoint, backend=[f.url for f in fakes],
                   profile="tiny@cpu", max_model_len=2048, policy="rr", **kw)


async def _complete(url: str, model: str, prompts: list[str], tokens: int = TOKENS
                    ) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async def one(prompt: str) -> dict:
            r = await client.post("/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True})
            return {"status": r.status_code, **r.json()}

        return await asyncio.gather(*(one(p) for p in prompts))


def _serves_on(gw: Running) -> None:
    """Nothing is left running at the servers: the healthy prompts come back whole."""
    after = asyncio.run(_complete(gw.url, gw.model, list(HEALTHY)))
    assert [r["usage"]["completion_tokens"] for r in after] == [TOKENS] * len(HEALTHY)


def expected(prompt: str) -> str:
    return bytes(generate(ByteTokenizer().encode(prompt), TOKENS)).decode()


@pytest.mark.parametrize("fault", ["drop", "malformed", "status500", "no-finish", "stall",
                                   "error-event"])
def test_a_broken_stream_resumes_alone_and_the_fleet_stays_whole(checkpoint, fault):
    faults = {ord("!"): fault}  # shared: the first server to get the prompt misbehaves, once
    fakes = [Served(FakeVLLM(seconds_per_token=0.005, faults=faults)) for _ in range(2)]
    # Only a stall needs the idle timeout to be found; a short one elsewhere lets a healthy
    # stream that a loaded machine held up for half a second pass for lost (a CI run beside
    # simulations resumed three).
    gw = gateway(checkpoint, fakes, upstream_idle_timeout=2.0 if fault == "stall" else 30.0)
    try:
        prompts = ["!faulty", *HEALTHY]
        results = asyncio.run(_complete(gw.url, gw.model, prompts))
        assert not faults, "the fault was not triggered"
        for prompt, r in zip(prompts, results, strict=True):
            assert r["status"] == 200, r
            assert r["usage"]["completion_tokens"] == TOKENS
            assert r["choices"][0]["finish_reason"] == "length"
            assert r["choices"][0]["text"] == expected(prompt)  # resumed exactly
        control = gw.server.control
        assert control.num_instance_failures == 0
        assert control.recovery.num_lost_resumed == 1
        assert sorted(control.instances) == [0, 1]
        assert all(control.accepting(i) for i in control.instances)
        assert sum(i.num_faults for i in control.instances.values()) == 1
        # The gauges hold what is really there: nothing queued, nothing in flight.
        assert gw.call(lambda: (control.num_queued(), len(control.records)
                                - control.ledger.num_done)) == (0, 0)
        # Nothing is left running at the servers, and the fleet serves on.
        _serves_on(gw)
    finally:
        gw.close()
        for f in fakes:
            f.stop()


def test_a_request_refused_with_a_4xx_fails_alone_and_counts_no_fault(checkpoint):
    fakes = [Served(FakeVLLM())]
    gw = gateway(checkpoint, fakes)
    try:
        # The fake refuses a non-integer priority with a 400, as vLLM refuses bad bodies.
        gw.server.control.instances[0].body = lambda request, best_effort, now: {"priority": 0.5}
        r = httpx.post(f"{gw.url}/v1/completions", timeout=30,
                       json={"model": gw.model, "prompt": "x", "max_tokens": 4})
        assert r.status_code == 500 and "answered 400" in r.json()["error"]["message"]
        instance = gw.server.control.instances[0]
        assert instance.num_faults == 0 and gw.server.control.recovery.num_lost_resumed == 0
    finally:
        gw.close()
        fakes[0].stop()


def test_an_unhealthy_server_leaves_and_is_readmitted_when_healthy_again(checkpoint):
    fakes = [Served(FakeVLLM(seconds_per_token=0.01)) for _ in range(2)]
    gw = gateway(checkpoint, fakes, backend_check_interval=0.2)
    try:
        async def run() -> list[dict]:
            task = asyncio.ensure_future(_complete(gw.url, gw.model, ["first", "second"]))
            while not all(f.fake.running for f in fakes):  # one on each server
                await asyncio.sleep(0.01)
            fakes[0].fake.healthy = False
            fakes[0].fake.dead = True  # its streams break off; /health answers 500
            return await task

        results = asyncio.run(run())
        assert [r["usage"]["completion_tokens"] for r in results] == [TOKENS, TOKENS]
        assert [r["choices"][0]["text"] for r in results] == [expected("first"),
                                                              expected("second")]
        control = gw.server.control
        assert control.num_instance_failures == 1
        healer = gw.server.services[0]
        time.sleep(1.0)
        assert healer.readmitted == []  # still unhealthy: not taken back
        fakes[0].fake.healthy, fakes[0].fake.dead = True, False
        deadline = time.monotonic() + 10
        while not healer.readmitted:
            assert time.monotonic() < deadline, "the healthy server was not re-admitted"
            time.sleep(0.05)
        assert healer.readmitted == [(2, fakes[0].url)]
        assert gw.call(lambda: sorted(i for i in control.instances
                                      if control.accepting(i))) == [1, 2]
        before = len(fakes[0].fake.bodies)
        asyncio.run(_complete(gw.url, gw.model, list(HEALTHY)))
        assert len(fakes[0].fake.bodies) > before  # it serves again
    finally:
        gw.close()
        for f in fakes:
            f.stop()


def test_every_backend_is_served_and_a_mismatch_is_an_error():
    urls = ["http://a:8000", "http://b:8000", "http://c:8000"]
    assert ServeConfig(engine="vllm", backend=urls).instances == 3
    assert ServeConfig(engine="vllm", backend=urls, instances=4).instances == 4
    with pytest.raises(ValueError, match="3 --backend URLs given but --instances is 2"):
        ServeConfig(engine="vllm", backend=urls, instances=2)
    with pytest.raises(ValueError, match="--prefill \\+ --decode is 2"):
        ServeConfig(engine="vllm", backend=urls, mode="pd")


def test_a_stream_cancelled_before_it_ran_still_reports_its_end():
    """A dispatch and its abort in one turn of the loop: the stream's task is cancelled before
    its first step, and must still say it ended, or the request would hang (review of
    issue 28)."""
    from hfx.backends.openai_stream import LocalRelay

    ended: list[tuple[str, int, str]] = []

    class Owner:
        url = "http://127.0.0.1:9"

        def on_tokens(self, rid, stream_id, ids, times):
            raise AssertionError("no tokens expected")

        def on_ended(self, rid, stream_id, ending):
            ended.append((rid, stream_id, ending.kind))

    async def run() -> None:
        relay = LocalRelay()
        relay.open(Owner(), "r1", 7, {"prompt": [1]})
        relay.cancel("r1", 7)  # the same turn: the task never ran
        relay.cancel("r1", 8)  # another stream's id: nothing
        await asyncio.sleep(0.05)
        await relay.close()

    asyncio.run(run())
    assert ended == [("r1", 7, "aborted")]


BAD = {"#": "drop", "$": "malformed", "%": "status500", "&": "no-finish", "*": "stall"}


def test_a_burst_of_bad_streams_never_empties_the_fleet_and_every_gauge_returns_to_zero(
        checkpoint):
    """The faulty mix of issue 50: 20 healthy 64-token streams sent with 10 requests that meet
    a fault on every server. Broken streams in a row eject a server (its running streams go
    on), but never both; every healthy stream finishes whole, every faulty request ends with
    its fault named, the gauges go back to 0, and the ejected server is re-admitted."""
    bad = {ord(c): kind for c, kind in BAD.items()}
    fakes = [Served(FakeVLLM(seconds_per_token=0.005, bad_prompts=bad)) for _ in range(2)]
    gw = gateway(checkpoint, fakes, upstream_idle_timeout=0.5, eject_seconds=1.0)
    control = gw.server.control
    healthy = [f"healthy {i:02d}" for i in range(20)]
    faulty = [f"{c}bad {i}" for c in BAD for i in range(2)]
    try:
        async def run() -> tuple[list[dict], list[int]]:
            accepting: list[int] = []
            done = asyncio.Event()

            async def watch() -> None:
                while not done.is_set():
                    accepting.append(await asyncio.to_thread(gw.call, lambda: sum(
                        control.accepting(i) for i in control.instances)))
                    await asyncio.sleep(0.01)

            watcher = asyncio.ensure_future(watch())
            results = await _complete(gw.url, gw.model, [*faulty, *healthy], 64)
            done.set()
            await watcher
            return results, accepting

        results, accepting = asyncio.run(run())
        by_prompt = dict(zip([*faulty, *healthy], results, strict=True))
        for prompt in healthy:
            r = by_prompt[prompt]
            assert r["status"] == 200, r
            assert r["usage"]["completion_tokens"] == 64
        for prompt in faulty:
            r = by_prompt[prompt]
            assert r["status"] != 200, r
            message = r["error"]["message"]
            assert "instance" in message and "no instance can serve" not in message, message
        assert min(accepting) >= 1, "the fleet was emptied"
        detector = control.outliers
        assert sum(detector.ejected.values()) >= 1, "no server was ejected"
        assert control.num_instance_failures == 0  # their health checks passed throughout
        assert sum(i.num_faults for i in control.instances.values()) == 2 * len(faulty)
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert "hfx_queued_requests 0.0" in metrics
        assert "hfx_in_flight_requests 0.0" in metrics
        assert 'hfx_upstream_faults_total{instance="0",kind="malformed"}' in metrics
        assert httpx.get(f"{gw.url}/ready").status_code == 200
        deadline = time.monotonic() + 10
        while gw.call(lambda: sum(control.accepting(i) for i in control.instances)) < 2:
            assert time.monotonic() < deadline, "the ejected server was not re-admitted"
            time.sleep(0.05)
        assert sum(detector.readmitted.values()) == sum(detector.ejected.values())
        _serves_on(gw)
    finally:
        gw.close()
        for f in fakes:
            f.stop()


def test_in_pd_bad_prefills_eject_one_prefill_server_never_both_and_healthy_requests_finish(
        checkpoint):
    """P/D, two prefill servers and one decode server: requests whose prefill answers 500 on
    every server break streams in a row; ejection takes at most one prefill server out (of a
    pool of two), the healthy requests prefill on the other and decode whole, and every gauge
    goes back to 0."""
    bad = {ord("%"): "status500"}
    fakes = [Served(FakeVLLM(seconds_per_token=0.002, bad_prompts=bad)) for _ in range(3)]
    gw = gateway(checkpoint, fakes, mode="pd", prefill=2, decode=1, eject_seconds=60.0)
    control = gw.server.control
    healthy = [f"healthy {i}" for i in range(8)]
    faulty = [f"%bad {i}" for i in range(8)]
    try:
        async def run() -> list[dict]:
            # The bad ones first, so that their faults come in a row.
            bad_results = await _complete(gw.url, gw.model, faulty, 16)
            return [*bad_results, *await _complete(gw.url, gw.model, healthy, 16)]

        results = asyncio.run(run())
        for r in results[len(faulty):]:
            assert r["status"] == 200 and r["usage"]["completion_tokens"] == 16, r
        for r in results[:len(faulty)]:
            message = r["error"]["message"]
            assert r["status"] == 500 and "no instance can serve" not in message, r
        assert sum(control.outliers.ejected.values()) == 1  # one prefill server, not both
        assert gw.call(lambda: sorted(control.fleet.ejected)) in ([0], [1])
        assert control.num_instance_failures == 0
        assert gw.call(lambda: (control.num_queued(), len(control.records)
                                - control.ledger.num_done)) == (0, 0)
    finally:
        gw.close()
        for f in fakes:
            f.stop()
