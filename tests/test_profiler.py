"""hfx profile: the grid is timed, the fit is written with held-out errors, hfx sim reads it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from hfx.cli import main
from hfx.engine.profiler import Grid, RecordingExecutor, profile_model
from hfx.model.build import build_model
from hfx.stepmodel.fit import refit, samples_of
from hfx.stepmodel.latency import load_profile


def test_profile_fits_and_simulates(tmp_path):
    grid = Grid((1, 2), (1, 4), (8, 32, 64), 256, 1)
    profile = profile_model(build_model("tiny", device="cpu"), grid, capacity_tokens=4096)
    assert profile.source == "measured"
    assert set(profile.fit_mape) == {"prefill", "decode", "prefill_heldout", "decode_heldout"}
    assert len(profile.meta["samples"]["prefill"]) == 6
    assert len(profile.meta["samples"]["decode"]) == 6
    assert profile.kv_capacity_tokens == 4096
    m = profile.model
    assert m.prefill_time(64, 64 * 64) > 0 and m.decode_time(64, 1) > 0
    path = tmp_path / "p.json"
    profile.save(path)
    assert load_profile(path).model == m
    out = tmp_path / "r.json"
    assert main(["sim", "--profile", str(path), "--instances", "1", "--qps", "4",
                 "--requests-per-task", "5", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["finished"] == 20


def test_a_profile_pooled_with_an_earlier_one_fits_both_measurements():
    """What bench/engine/fidelity.py brackets a run with: the samples before it, then after it."""
    loaded = build_model("tiny", device="cpu")
    grid = Grid((1, 2), (1, 4), (8, 32, 64), 256, 1)
    before = profile_model(loaded, grid, capacity_tokens=4096)
    after = profile_model(loaded, grid, capacity_tokens=4096, also=samples_of(before))
    (p0, d0), (p1, d1) = samples_of(before), samples_of(after)
    assert (len(p0), len(d0)) == (6, 6) and (len(p1), len(d1)) == (12, 12)
    assert p1[:6] == p0 and d1[:6] == d0  # the earlier samples first, as measured
    assert [s[0] for s in p1[6:]] == [s[0] for s in p0]  # the same points again
    assert [s[:2] for s in d1[6:]] == [s[:2] for s in d0]
    # Refitted with more samples, without measuring again: the earlier ones, then these.
    again = samples_of(refit(before, (p0[:2], d0[:3])))
    assert again == (p0 + p0[:2], d0 + d0[:3])


def test_a_recording_executor_keeps_whole_prefill_and_pure_decode_steps():
    """A serving run's own steps as profile samples: prompts of 20 and 7 prefilled together,
    then decodes at the contexts they reach; steps that mix the two are not samples."""
    import asyncio

    from hfx.engine import EngineConfig, EngineCore, Sequence
    from hfx.engine.torch_executor import TorchExecutor

    loaded = build_model("tiny", device="cpu")
    recorder = RecordingExecutor(TorchExecutor(loaded.model, 64, 16))
    engine = EngineCore(EngineConfig(num_kv_blocks=64, block_size=16), recorder)

    async def go() -> None:
        engine.add_request(Sequence("a", 20, 3, prompt_token_ids=[1] * 20))
        engine.add_request(Sequence("b", 7, 3, prompt_token_ids=[2] * 7))
        while engine.has_work():
            await engine.step()

    asyncio.run(go())
    prefill, decode = recorder.samples()
    assert [lens for lens, _, _ in prefill] == [[20, 7]]
    # Two decode steps (3 tokens: the first comes with the prefill), both sequences in each.
    assert [(b, ctx) for b, ctx, _ in decode] == [(2, 21 + 8), (2, 22 + 9)]
    assert all(t > 0 for *_, t in decode)


def test_profile_cli_refuses_bad_options(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--shape", "tiny", "--dtype", "int3"])
    assert main(["profile", "--shape", "gpt-5", "--out", "/dev/null"]) == 2
    assert "unknown model shape" in capsys.readouterr().err
