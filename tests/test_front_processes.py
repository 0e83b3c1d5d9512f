"""``hfx serve --api-workers 2``: the control plane in one process, HTTP and the
streams from vLLM servers in two front processes.

The tree runs as a real process tree in front of stand-in vLLM servers
(tests/helpers/fake_vllm.py): it serves what the one-process gateway serves, token for token;
its guards hold; a killed front leaves nothing running upstream and is replaced; a dead control
plane ends the fronts' streams and the fronts exit; a malformed message on the channel is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("msgpack")
httpx = pytest.importorskip("httpx")

from helpers.fake_vllm import FakeVLLM, Served, generate  # noqa: E402
from helpers.live import Running, Tree  # noqa: E402

from hfx.model.build import write_random_checkpoint  # noqa: E402
from hfx.model.tokenizer import ByteTokenizer  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_random_checkpoint("tiny", tmp_path_factory.mktemp("ckpt")))


@contextlib.contextmanager
def tree_over(checkpoint: str, fakes: list[Served], *extra: str) -> Iterator[Tree]:
    tree = Tree("--engine", "vllm", "--checkpoint", checkpoint, "--profile", "tiny@cpu",
                "--max-model-len", "2048", "--policy", "rr", "--calibrate-every", "0",
                *[a for f in fakes for a in ("--backend", f.url)], *extra)
    try:
        yield tree
    finally:
        tree.close()


PROMPTS = [f"request number {i}" for i in range(24)]


async def _ask(url: str, model: str, prompts: list[str], stream: bool,
               stops: bool = True, max_tokens: int | None = None) -> list[dict]:
    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection each: both fronts
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def one(i: int, prompt: str) -> dict:
            n = max_tokens or 8 + i % 9
            # Every fifth request stops at its own third character: a stop string at work.
            stop = bytes(generate(ByteTokenizer().encode(prompt), n)).decode()[2]
            body = {"model": model, "prompt": prompt, "max_tokens": n, "ignore_eos": True,
                    "stream": stream, "stop": stop if stops and i % 5 == 0 else None}
            if not stream:
                r = await client.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                out = r.json()
                return {"id": out["id"], "text": out["choices"][0]["text"],
                        "finish": out["choices"][0]["finish_reason"],
                        "tokens": out["usage"]["completion_tokens"]}
            text, finish, rid = "", None, ""
            async with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = httpx.Response(200, content=line[6:]).json()
                        rid = chunk["id"]
                        text += chunk["choices"][0]["text"]
                        finish = chunk["choices"][0]["finish_reason"] or finish
            return {"id": rid, "text": text, "finish": finish}

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def _front_of(request_id: str) -> str:
    return request_id.split("-")[1]  # a front's ids carry its pid (hfx/serving/front.py)


def test_two_fronts_serve_what_one_process_serves(checkpoint):
    fake = Served(FakeVLLM(seconds_per_token=0.002))
    one = Running(engine="vllm", checkpoint=checkpoint, backend=[fake.url], profile="tiny@cpu",
                  max_model_len=2048, policy="rr", calibrate_every=0)
    try:
        want = {s: asyncio.run(_ask(one.url, one.model, PROMPTS, s)) for s in (False, True)}
    finally:
        one.close()
    try:
        with tree_over(checkpoint, [fake]) as tree:
            got = {s: asyncio.run(_ask(tree.url, tree.model, PROMPTS, s)) for s in (False, True)}
            strip = [{k: v for k, v in r.items() if k != "id"} for r in want[True]]
            assert [{k: v for k, v in r.items() if k != "id"} for r in got[True]] == strip
            assert [{k: v for k, v in r.items() if k != "id"} for r in got[False]] == [
                {k: v for k, v in r.items() if k != "id"} for r in want[False]]
            assert any(r["finish"] == "stop" for r in got[True])  # stop strings held
            # Both fronts served (the kernel hands connections to whichever accepts first:
            # more rounds until both have, if one was quicker every time).
            fronts = {_front_of(r["id"]) for r in got[True] + got[False]}
            rounds = 2
            while len(fronts) < 2 and rounds < 12:
                fronts |= {_front_of(r["id"])
                           for r in asyncio.run(_ask(tree.url, tree.model, PROMPTS, False))}
                rounds += 1
            assert len(fronts) == 2, "one front served everything"
            # One /metrics for the tree: every request, whichever front answered it.
            assert tree.metric("hfx_requests_total") == rounds * len(PROMPTS)
            assert tree.metric("hfx_in_flight_requests") == 0
    finally:
        fake.stop()


def test_pd_through_two_fronts_prefills_on_one_server_and_decodes_on_the_other(checkpoint):
    prefill, decode = Served(FakeVLLM()), Served(FakeVLLM())
    try:
        with tree_over(checkpoint, [prefill, decode], "--mode", "pd") as tree:
            prompts = [f"split {i}" for i in range(6)]
            out = asyncio.run(_ask(tree.url, tree.model, prompts, True, stops=False))
            for i, (prompt, r) in enumerate(zip(prompts, out, strict=True)):
                assert r["text"] == bytes(generate(ByteTokenizer().encode(prompt),
                                                   8 + i % 9)).decode()
            # Every prompt prefilled on one server; the rest decoded on the other.
            assert sorted(b["max_tokens"] for b in prefill.fake.bodies) == [1] * 6
            assert len(decode.fake.bodies) == 6
    finally:
        prefill.stop()
        decode.stop()


def test_failover_through_two_fronts_resumes_on_the_other_server(checkpoint):
    fakes = [Served(FakeVLLM(seconds_per_token=0.01)) for _ in range(2)]
    try:
        with tree_over(checkpoint, fakes) as tree:
            prompts = [f"resume {i}" for i in range(6)]

            async def run() -> list[dict]:
                task = asyncio.ensure_future(_ask(tree.url, tree.model, prompts, True,
                                                  stops=False, max_tokens=150))
                while not all(f.fake.running for f in fakes):  # streams on both servers
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)
                await asyncio.to_thread(fakes[0].die)
                return await task

            out = asyncio.run(run())
            for prompt, r in zip(prompts, out, strict=True):  # whole, as if nothing happened
                assert r["finish"] == "length"
                assert r["text"] == bytes(generate(ByteTokenizer().encode(prompt), 150)
                                          ).decode()
            assert tree.metric("hfx_instance_failures_total") == 1
            assert tree.metric("hfx_resumed_requests_total") >= 1
    finally:
        fakes[1].stop()


def test_guards_and_disconnects_hold_with_two_fronts(checkpoint):
    fake = Served(FakeVLLM(seconds_per_token=0.01))
    try:
        with tree_over(checkpoint, [fake], "--api-key", "s3cret", "--max-body-bytes",
                       "2048") as tree:
            auth = {"Authorization": "Bearer s3cret"}
            body = {"model": tree.model, "prompt": "hi", "max_tokens": 3}
            assert httpx.post(f"{tree.url}/v1/completions", json=body).status_code == 401
            ok = httpx.post(f"{tree.url}/v1/completions", json=body, headers=auth)
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
            big = {**body, "prompt": "x" * 4096}
            r = httpx.post(f"{tree.url}/v1/completions", json=big, headers=auth)
            assert r.status_code == 413
            bad = httpx.post(f"{tree.url}/v1/completions", headers=auth,
                             json={**body, "slo": {"ttft_ms": -1, "tpot_ms": 5}})
            assert bad.status_code == 400
            unknown = httpx.post(f"{tree.url}/v1/completions", headers=auth,
                                 json={**body, "model": "nope"})
            assert unknown.status_code == 404
            # A client that leaves mid-stream: its request stops at the server.
            long = {**body, "max_tokens": 1500, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", f"{tree.url}/v1/completions", json=long, headers=auth,
                              timeout=30) as s:
                next(line for line in s.iter_lines() if line.startswith("data: "))
            _wait(lambda: fake.fake.cancelled and not fake.fake.running, "the abort upstream")
            _wait(lambda: tree.metric("hfx_in_flight_requests") == 0, "the gauge")
            assert "aborted" in httpx.get(f"{tree.url}/metrics", headers=auth).text
    finally:
        fake.stop()


def test_overload_is_shed_by_the_control_plane_behind_two_fronts():
    from hfx.stepmodel.latency import load_profile

    prompt = [7] * 2000
    alone = load_profile("qwen2.5-7b@ascend-910b").model.prefill_one(len(prompt))
    tree = Tree("--executor", "sim", "--instances", "1", "--max-queued", "2", "--max-wait", "0")
    try:
        body = {"model": tree.model, "prompt": prompt, "max_tokens": 4,
                "slo": {"ttft_ms": 1.3 * alone * 1e3, "tpot_ms": 500}}

        async def burst() -> list[int]:
            async with httpx.AsyncClient(base_url=tree.url, timeout=30) as c:
                answers = await asyncio.gather(*(c.post("/v1/completions", json=body)
                                                 for _ in range(8)))
            return sorted(r.status_code for r in answers)

        codes = asyncio.run(burst())
        assert 429 in codes and 200 in codes, codes
        assert set(codes) <= {200, 429, 503}
    finally:
        tree.close()


@contextlib.contextmanager
def sim_tree() -> Iterator[Tree]:
    tree = Tree("--executor", "sim", "--profile", "tiny@cpu", "--instances", "1",
                "--policy", "rr")
    try:
        yield tree
    finally:
        tree.close()


@pytest.mark.parametrize(("engine", "how"), [("vllm", "kill"), ("sim", "kill"),
                                            ("vllm", "freeze")])
def test_a_killed_front_aborts_its_requests_and_is_replaced(checkpoint, engine, how):
    """vLLM: the streams the front ran die with it; sim: the engine in the control process
    must be told, or it would finish them. A frozen front (SIGSTOP: alive, answering no one)
    stops beating; past --front-timeout the control process kills it, and the same follows."""
    fake = Served(FakeVLLM(seconds_per_token=0.01))
    try:
        with (tree_over(checkpoint, [fake], "--front-timeout", "1") if engine == "vllm"
              else sim_tree()) as tree:
            fronts = tree.fronts()
            assert len(fronts) == 2

            async def run() -> tuple[int, list[dict | str]]:
                limits = httpx.Limits(max_keepalive_connections=0)
                async with httpx.AsyncClient(base_url=tree.url, timeout=60,
                                             limits=limits) as client:
                    seen: dict[str, int] = {}  # front → streams it holds

                    async def one(i: int) -> dict | str:
                        body = {"model": tree.model, "prompt": f"p{i}", "max_tokens": 600,
                                "stream": True, "ignore_eos": True}
                        rid, n = "", 0
                        try:
                            async with client.stream("POST", "/v1/completions",
                                                     json=body) as r:
                                async for line in r.aiter_lines():
                                    if line.startswith("data: {"):
                                        if not rid:
                                            rid = line.split('"id":"')[1].split('"')[0]
                                            seen[_front_of(rid)] = seen.get(
                                                _front_of(rid), 0) + 1
                                        n += 1
                        except httpx.TransportError:
                            return f"broken {rid}"
                        return {"id": rid, "chunks": n}

                    # New connections until both fronts hold streams (the kernel picks).
                    tasks: list[asyncio.Task] = []
                    while len(seen) < 2 or len(tasks) < 4:
                        assert len(tasks) < 40, "one front took every connection"
                        tasks.append(asyncio.create_task(one(len(tasks))))
                        while sum(seen.values()) < len(tasks):
                            await asyncio.sleep(0.01)
                    victim = next(p for p in fronts if f"{p:x}" in seen)
                    os.kill(victim, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
                    return victim, await asyncio.gather(*tasks)

            victim, results = asyncio.run(run())
            killed = f"{victim:x}"
            broken = [r for r in results if isinstance(r, str)]
            whole = [r for r in results if isinstance(r, dict)]
            assert broken and whole, results  # both fronts had streams
            assert all(_front_of(r.split()[1]) == killed for r in broken if " " in r)
            assert all(r["chunks"] == 600 + 1 and _front_of(r["id"]) != killed for r in whole)
            # Nothing of the killed front's runs on; the tree's gauges are back to 0.
            if engine == "vllm":
                _wait(lambda: not fake.fake.running, "vLLM to drop the killed front's requests")
                assert len(fake.fake.cancelled) == len(broken)
            _wait(lambda: tree.metric("hfx_in_flight_requests") == 0, "the gauge")
            assert tree.metric("hfx_queued_requests") == 0
            assert tree.metric('hfx_requests_total{outcome="aborted",task="default"}') == len(
                broken)
            assert tree.metric('hfx_requests_total{outcome="finished",task="default"}') == len(
                whole)
            # A new front took its place and serves.
            _wait(lambda: len(tree.fronts()) == 2 and victim not in tree.fronts(),
                  "the front's restart")
            out = asyncio.run(_ask(tree.url, tree.model, PROMPTS[:8], False))
            assert len({_front_of(r["id"]) for r in out} - {killed}) >= 1
    finally:
        fake.stop()


def test_sigterm_drains_the_tree_in_flight_streams_finish_and_it_exits_0(checkpoint):
    fake = Served(FakeVLLM(seconds_per_token=0.005))
    try:
        with tree_over(checkpoint, [fake], "--shutdown-timeout", "30") as tree:
            body = {"model": tree.model, "prompt": "p", "max_tokens": 400, "stream": True,
                    "ignore_eos": True}
            chunks, late_sent = 0, False
            with httpx.stream("POST", f"{tree.url}/v1/completions", json=body,
                              timeout=30) as s:
                for line in s.iter_lines():
                    chunks += line.startswith("data: {")
                    if chunks == 1 and tree.proc.poll() is None and not late_sent:
                        late_sent = True
                        tree.proc.send_signal(signal.SIGTERM)
                        time.sleep(1.0)  # the fronts have closed their listeners by then
                        # Refused at once, or a 503: never taken into a backlog nobody
                        # accepts (it was reset there, or waited out its timeout).
                        with contextlib.suppress(httpx.ConnectError):
                            late = httpx.post(f"{tree.url}/v1/completions", timeout=5,
                                              json={**body, "stream": False})
                            assert late.status_code == 503, late.text
            assert chunks == 400 + 1  # every token, then the final chunk
            assert tree.proc.wait(timeout=30) == 0, tree.proc.stdout.read()
    finally:
        fake.stop()


def test_a_dead_control_plane_ends_the_streams_and_the_fronts_exit(checkpoint):
    fake = Served(FakeVLLM(seconds_per_token=0.01))
    try:
        with tree_over(checkpoint, [fake]) as tree:
            fronts = tree.fronts()
            body = {"model": tree.model, "prompt": "p", "max_tokens": 1500, "stream": True,
                    "ignore_eos": True}
            t0 = time.monotonic()
            lines = []
            with contextlib.suppress(httpx.TransportError), httpx.stream(
                    "POST", f"{tree.url}/v1/completions", json=body, timeout=30) as s:
                for line in s.iter_lines():
                    lines.append(line)
                    if len(lines) == 2:
                        os.kill(tree.proc.pid, signal.SIGKILL)
            assert time.monotonic() - t0 < 15, "the stream hung"
            assert any("control plane" in line for line in lines), lines[-3:]
            _wait(lambda: not any(os.path.exists(f"/proc/{p}") and _alive(p) for p in fronts),
                  "the fronts to exit")
    finally:
        fake.stop()


def _alive(pid: int) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"
    return False


def _frame(payload: bytes) -> bytes:
    """One frame of the front channel (hfx/serving/ipc.py): a 4-byte length, then the bytes."""
    import struct

    return struct.pack("!I", len(payload)) + payload


def test_a_malformed_message_on_the_channel_is_dropped():
    import struct

    import msgpack

    from hfx.config import ServeConfig
    from hfx.serving.build import build_server
    from hfx.serving.hub import FrontHub

    async def read_frame(reader: asyncio.StreamReader) -> list:
        (n,) = struct.unpack("!I", await reader.readexactly(4))
        return msgpack.unpackb(await reader.readexactly(n))

    async def run() -> tuple[list, int, bool]:
        server = build_server(ServeConfig(executor="sim", instances=1))
        address = f"{tempfile.mkdtemp()}/control"
        hub = FrontHub(server, address, tokens_at_front=False)
        await server.start()
        await hub.start()
        reader, writer = await asyncio.open_unix_connection(address)
        writer.write(_frame(b"front-0"))  # the connection's name
        model = server.options.model_name
        writer.write(_frame(msgpack.packb([["open", "r0", "cmpl", model, [1], 1,
                                           [0.0, 1.0, None], [2.0, 0.5], None, "default",
                                           "body", True]])))
        writer.write(_frame(msgpack.packb([["hello"]])))  # the open above came from a stranger
        for junk in (b"\xc1 not msgpack", msgpack.packb({"a": 1}), msgpack.packb([["bogus"]]),
                     msgpack.packb([["open", "r1"]]),  # too few fields
                     msgpack.packb([17, ["bogus"]])):  # two in one frame: neither is valid
            writer.write(_frame(junk))
        # The next open arrives split over writes, as a socket may deliver it.
        whole = _frame(msgpack.packb([["open", "r2", "cmpl", model, [1, 2, 3], 3,
                                      [0.0, 1.0, None], [2.0, 0.5], None, "default", "body",
                                      True]]))
        for i in range(0, len(whole), 7):
            writer.write(whole[i:i + 7])
            await writer.drain()
            await asyncio.sleep(0)
        got: list = []
        while not got or got[-1][0] != "end":
            got += await asyncio.wait_for(read_frame(reader), 10)
        # A length no frame may have: the stream cannot be resynchronised, so it is closed;
        # the hub and its server go on.
        writer.write(struct.pack("!I", 0xFFFFFFFF) + b"x")
        await asyncio.wait_for(reader.read(), 10)  # to the end: the hub closed it
        closed = reader.at_eof()
        writer.close()
        await hub.stop()
        await server.stop()
        return got, hub.num_dropped, closed

    got, dropped, closed = asyncio.run(run())
    kinds = [m[0] for m in got if m[0] != "state"]
    assert kinds[0] == "opened" and kinds[-1] == "end"
    assert sum(len(ids) for m in got if m[0] == "tokens" for _, ids in m[1]) == 3
    assert got[-1][2] == "length"
    assert dropped == 7
    assert not any(m[0] in ('opened', 'refused') and m[1] == 'r0' for m in got)
    assert closed


def _wait(ok, what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_api_workers_auto_counts_the_cores_this_process_may_use_and_bad_values_are_refused():
    import subprocess
    import sys

    from hfx.config import ServeConfig

    code = ("import os; os.sched_setaffinity(0, {0}); from hfx.config import ServeConfig; "
            "print(ServeConfig(api_workers='auto').num_api_workers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "1", out.stderr  # pinned to one core: one front
    assert ServeConfig(api_workers="3").num_api_workers == 3
    for bad in ("0", "two", "-1", ""):
        with pytest.raises(ValueError):
            ServeConfig(api_workers=bad)


def test_a_front_reports_first_tokens_at_once_and_the_rest_in_batches(vloop):
    """Progress to the control process: a request's first token within 2 ms (TTFT is what the
    dispatcher decides on), later tokens batched for 20 ms, each with its own time, in order."""
    from hfx.serving.front import FIRST_TOKEN_SECONDS, PROGRESS_SECONDS, Progress

    sent: list[tuple[float, list]] = []

    async def stream() -> None:
        loop = asyncio.get_running_loop()
        progress = Progress(lambda batch: sent.append((loop.time(), batch)))
        t0 = loop.time()
        progress.add(("a", 0), [1], t0, first=True)
        await asyncio.sleep(0.003)
        progress.add(("a", 0), [2, 3], loop.time(), first=False)
        await asyncio.sleep(0.001)
        progress.add(("a", 0), [4], loop.time(), first=False)
        await asyncio.sleep(0.006)  # at 10 ms, b's first token pulls the batch forward
        progress.add(("b", 7), [9], loop.time(), first=True)
        await asyncio.sleep(0.05)
        progress.add(("a", 0), [5], loop.time(), first=False)  # at 60 ms: sent at 80
        await asyncio.sleep(0.025)
        progress.add(("a", 0), [6], loop.time(), first=False)
        progress.flush()  # a stream's end sends what waits at once: at 85 ms
        await asyncio.sleep(0.05)

    vloop.run_until_complete(stream())
    t0 = sent[0][0] - FIRST_TOKEN_SECONDS
    assert [round(t - t0, 6) for t, _ in sent] == [0.002, 0.012, 0.06 + PROGRESS_SECONDS, 0.085]
    assert sent[0][1] == [["a", 0, [1], [t0]]]
    assert sent[1][1] == [["a", 0, [2, 3, 4], [t0 + 0.003] * 2 + [t0 + 0.004]],
                          ["b", 7, [9], [t0 + 0.01]]]
    assert [b for _, b in sent[2:]] == [[["a", 0, [5], [pytest.approx(t0 + 0.06)]]],
                                        [["a", 0, [6], [pytest.approx(t0 + 0.085)]]]]


def test_a_message_that_cannot_be_encoded_is_dropped_alone():
    import struct

    import msgpack

    from hfx.serving.ipc import pack

    frame = pack([["abort", "r1", False], ["ended", "r2", 0, "fault", None, "\ud800"],
                  ["abort", "r3", 1 << 70], ["abort", "r4", True]])
    (n,) = struct.unpack("!I", frame[:4])
    assert msgpack.unpackb(frame[4:4 + n]) == [["abort", "r1", False], ["abort", "r4", True]]


def test_a_fronts_closed_channel_aborts_what_it_owned():

    import msgpack

    from hfx.config import ServeConfig
    from hfx.serving.build import build_server
    from hfx.serving.hub import FrontHub

    async def run() -> tuple[int, int, bool]:
        server = build_server(ServeConfig(executor="sim", instances=1))
        address = f"{tempfile.mkdtemp()}/control"
        hub = FrontHub(server, address, tokens_at_front=False)
        await server.start()
        await hub.start()
        _, writer = await asyncio.open_unix_connection(address)
        writer.write(_frame(b"front-0") + _frame(msgpack.packb([["hello"]])))
        writer.write(_frame(msgpack.packb([["open", "r0", "cmpl", server.options.model_name,
                                           [1], 3000, [0.0, 1.0, None], [20.0, 1.0], None,
                                           "default", "body", True]])))
        await writer.drain()
        while "r0" not in server.control.records:
            await asyncio.sleep(0.01)
        running = len(server.control.records)
        writer.close()  # the front is gone without a word
        for _ in range(500):
            if not server.control.records:
                break
            await asyncio.sleep(0.01)
        left, known = len(server.control.records), b"front-0" in hub.fronts
        await hub.stop()
        await server.stop()
        return running, left, known

    running, left, known = asyncio.run(run())
    assert running == 1 and left == 0 and not known


def test_with_two_fronts_a_burst_of_bad_streams_ejects_at_most_one_server_and_gauges_clear(
        checkpoint):
    """Issue 50 through the fronts: the streams break in the front processes, the control
    process counts the faults and ejects; every healthy stream still finishes whole, every bad
    one ends with its fault named, and nothing is left queued or in flight."""
    bad = {ord(c): kind for c, kind in {"#": "drop", "$": "malformed", "%": "status500",
                                        "&": "no-finish"}.items()}
    fakes = [Served(FakeVLLM(seconds_per_token=0.005, bad_prompts=bad)) for _ in range(2)]
    healthy = [f"healthy {i:02d}" for i in range(16)]
    faulty = [f"{chr(c)}bad {i}" for c in bad for i in range(2)]
    try:
        with tree_over(checkpoint, fakes, "--eject-seconds", "60") as tree:
            async def burst() -> list[httpx.Response]:
                limits = httpx.Limits(max_keepalive_connections=0)
                async with httpx.AsyncClient(base_url=tree.url, timeout=60,
                                             limits=limits) as client:
                    return await asyncio.gather(*(client.post(
                        "/v1/completions", headers={"x-tenant": "team-" + p[0]}, json={
                            "model": tree.model, "prompt": p, "max_tokens": 48,
                            "ignore_eos": True}) for p in [*faulty, *healthy]))

            results = dict(zip([*faulty, *healthy], asyncio.run(burst()), strict=True))
            for p in healthy:
                assert results[p].status_code == 200, results[p].text
                assert results[p].json()["usage"]["completion_tokens"] == 48
            for p in faulty:
                message = results[p].json()["error"]["message"]
                assert "no instance can serve" not in message and "vLLM" in message, message
            metrics = httpx.get(f"{tree.url}/metrics").text
            ejected = [line for line in metrics.splitlines()
                       if line.startswith("hfx_instances{") and 'state="ejected"' in line]
            assert ejected and ejected[0].endswith(" 1.0"), ejected  # one of two, for 60 s
            assert "hfx_queued_requests 0.0" in metrics
            assert "hfx_in_flight_requests 0.0" in metrics
            # Each request's tenant came through its front with it.
            assert ('hfx_tenant_requests_total{outcome="finished",tenant="team-h"} 16.0'
                    in metrics)
            after = asyncio.run(_ask(tree.url, tree.model, PROMPTS[:4], False))
            assert len(after) == 4  # the other server serves on
    finally:
        for f in fakes:
            f.stop()
