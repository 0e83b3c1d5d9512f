"""``hfx serve --record FILE``: every request served becomes a trace row, written off
the hot path and rotated by size, with the dispatcher's profile beside it."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from helpers.live import Running  # noqa: E402

from hfx.stepmodel.latency import load_profile  # noqa: E402


def test_every_request_is_recorded_with_its_slo_source_and_the_profile_beside(tmp_path):
    path = tmp_path / "rec" / "served.jsonl"
    gw = Running(executor="sim", instances=1, record=str(path))
    asks = [({"slo": {"ttft_ms": 3000, "tpot_ms": 400}}, {}, "body"),
            ({}, {"x-slo-ttft-ms": "2500", "x-slo-tpot-ms": "300"}, "header"),
            ({"task": "gsm8k"}, {}, "task"),
            ({"priority": 1}, {}, "priority"),
            ({}, {}, "default")]
    try:
        for i, (extra, headers, _) in enumerate(asks):
            r = httpx.post(f"{gw.url}/v1/completions", headers=headers, timeout=30, json={
                "model": gw.model, "prompt": "x" * (3 + i), "max_tokens": 2 + i, **extra})
            assert r.status_code == 200, r.text
        refused = httpx.post(f"{gw.url}/v1/completions", timeout=30, json={
            "model": gw.model, "prompt": "x", "max_tokens": 2, "priority": 99})
        assert refused.status_code == 400  # refused before submission: no row
        step_model = gw.server.control.step_model
    finally:
        gw.close()  # the last rows are flushed when the server stops
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["slo_source"] for r in rows] == [s for _, _, s in asks]
    assert [r["input_len"] for r in rows] == [3, 4, 5, 6, 7]
    assert [r["output_len"] for r in rows] == [r["max_tokens"] for r in rows] == [2, 3, 4, 5, 6]
    assert {r["outcome"] for r in rows} == {"finished"}
    assert rows[0]["slo"] == {"ttft_ms": 3000.0, "tpot_ms": 400.0}
    assert rows[1]["slo"] == {"ttft_ms": 2500.0, "tpot_ms": 300.0}
    assert rows[2]["task"] == "gsm8k" and rows[3]["priority"] == 1
    assert rows[3]["slo"] is not None  # the SLO HFX-PM mapped it to
    assert all(r["ttft_s"] > 0 and r["instance"] == 0 for r in rows)
    assert "prompt_token_ids" not in rows[0]  # no prompts unless asked
    assert [r["arrival"] for r in rows] == sorted(r["arrival"] for r in rows)
    assert rows[0]["arrival"] > 1.7e9  # epoch seconds
    profile = load_profile(str(path) + ".profile.json")
    assert profile.model == step_model


def test_the_record_rotates_by_size_and_keeps_every_row(tmp_path):
    from hfx.config import ServeConfig
    from hfx.serving.build import build_server
    from hfx.serving.recorder import KEEP, Recorder

    path = tmp_path / "r.jsonl"

    async def run() -> Recorder:
        server = build_server(ServeConfig(executor="sim", instances=1))
        await server.start()
        recorder = Recorder(path, server.control, max_bytes=2000)
        recorder.start()
        model = server.options.model_name
        from hfx.request import SLO
        from hfx.sampling import SamplingParams
        from hfx.serving.server import AppliedSLO

        server.recorder = recorder
        for i in range(40):
            stream = server.open("cmpl", model, [1] * (i + 1), 1, SamplingParams(),
                                 AppliedSLO(SLO(5, 1), None, "default", "body"), True)
            async for _ in stream.events():
                pass
            if i % 5 == 4:
                await recorder.flush()
        await recorder.stop()
        await server.stop()
        return recorder

    recorder = asyncio.run(run())
    files = sorted(tmp_path.glob("r.jsonl*"))
    rotated = [f for f in files if f.name[len("r.jsonl."):].isdigit()]
    assert 1 <= len(rotated) <= KEEP
    assert all(f.stat().st_size < 2000 + 1500 for f in [*rotated, path])
    oldest_first = [*sorted(rotated, reverse=True), path]
    ids = [json.loads(line)["input_len"] for f in oldest_first
           for line in f.read_text().splitlines()]
    # The newest rows, oldest first across the files; nothing lost that a file still holds.
    assert ids == list(range(41 - len(ids), 41)) and recorder.written == 40


def test_a_recorded_run_replays_on_the_simulator_and_sizes_a_fleet(tmp_path):
    """What was served goes back in: hfx sim reads the record (its format found by itself)
    with the profile written beside it, and hfx whatif sizes a fleet for it."""
    from hfx.config import SimConfig
    from hfx.evaluation.whatif import table, whatif
    from hfx.sim.driver import load_requests, simulate
    from hfx.workloads.traces import detect_format

    path = tmp_path / "served.jsonl"
    gw = Running(executor="sim", instances=1, record=str(path))
    try:
        for i in range(12):
            r = httpx.post(f"{gw.url}/v1/completions", timeout=30, json={
                "model": gw.model, "prompt": "y" * (5 + i), "max_tokens": 3 + i % 4,
                "task": "gsm8k" if i % 2 else None})
            assert r.status_code == 200, r.text
    finally:
        gw.close()
    assert detect_format(path) == "hfx-record"
    config = SimConfig(workload=str(path), profile=str(path) + ".profile.json", instances=1,
                       policy="rr")
    requests = load_requests(config)
    assert [r.prompt_len for r in requests] == [5 + i for i in range(12)]
    assert [r.max_tokens for r in requests] == [3 + i % 4 for i in range(12)]
    assert requests[0].arrival == 0.0 and requests[1].arrival > 0
    assert [r.task for r in requests[:2]] == ["default", "gsm8k"]
    result = simulate(config)
    assert result["finished"] == 12 and result["requests"] == 12
    out = whatif(config, ["rr", "hfx"], [1, 2], 0.9, jobs=1, progress=False)
    assert [(r["policy"], r["instances"]) for r in out["rows"]] == [
        ("rr", 1), ("rr", 2), ("hfx", 1), ("hfx", 2)]
    assert all(r["finished"] == 12 for r in out["rows"])
    # Twelve sparse requests: one instance meets the target; cost grows with the fleet.
    assert out["smallest"] == {"rr": 1, "hfx": 1}
    assert out["rows"][1]["cost_units"] > out["rows"][0]["cost_units"]
    assert "smallest fleet at attainment >= 0.9: rr 1, hfx 1" in table(out)


def test_a_replay_delays_every_token_by_the_delivery_latency_its_profile_carries(tmp_path):
    """The live calibration's delivery latency, written into the recorded profile, reaches the
    simulator: every token is recorded that much later (TTFT and E2E move by it, TPOT does not),
    and --token-delivery overrides it."""
    from dataclasses import replace

    from hfx.config import SimConfig
    from hfx.sim.driver import simulate

    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(load_profile("tiny@cpu").to_json()))
    recorded = tmp_path / "recorded.json"
    profile = load_profile("tiny@cpu")
    recorded.write_text(json.dumps(replace(
        profile, meta={**profile.meta, "token_delivery_seconds": 0.025}).to_json()))
    # Sparse arrivals on two instances under rr: no decision waits on a finish, so the delay
    # changes no schedule and shows whole in every token.
    common = dict(workload="four-task", qps=0.5, requests_per_task=3, instances=2,
                  policy="rr", step_noise=0.0, model="tiny", hardware="cpu")
    base = simulate(SimConfig(profile=str(plain), **common))
    late = simulate(SimConfig(profile=str(recorded), **common))
    off = simulate(SimConfig(profile=str(recorded), token_delivery=0.0, **common))
    assert base["finished"] == late["finished"] == 12
    assert late["ttft"]["mean"] == pytest.approx(base["ttft"]["mean"] + 0.025)
    assert late["ttft"]["p99"] == pytest.approx(base["ttft"]["p99"] + 0.025)
    assert late["tpot"]["mean"] == pytest.approx(base["tpot"]["mean"])
    assert off["ttft"] == base["ttft"] and off["tpot"] == base["tpot"]


def test_a_flush_cancelled_mid_write_by_stop_writes_its_rows_once(tmp_path):
    """stop() cancels the periodic flush; if that lands while a write runs in its thread, the
    thread still writes those rows, and stop's own flush must not write them again."""
    import threading
    from types import SimpleNamespace

    from hfx.serving.recorder import Recorder
    from hfx.stepmodel.latency import load_profile as profile_of

    profile = profile_of("tiny@cpu")
    control = SimpleNamespace(profile=profile, step_model=profile.model)
    path = tmp_path / "rows.jsonl"
    recorder = Recorder(path, control)  # type: ignore[arg-type]
    release = threading.Event()
    write = recorder._write

    def slow_write(rows, prof):
        release.wait(10)
        write(rows, prof)

    recorder._write = slow_write  # type: ignore[method-assign]

    async def main() -> None:
        recorder.rows = [{"id": "a"}, {"id": "b"}]
        flush = asyncio.ensure_future(recorder.flush())
        await asyncio.sleep(0.05)  # the write is in its thread now
        recorder._task = flush
        stopping = asyncio.ensure_future(recorder.stop())
        await asyncio.sleep(0.05)
        release.set()
        await stopping

    asyncio.run(main())
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "b"]
    assert recorder.written == 2
