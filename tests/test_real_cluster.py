"""The control plane over real engines on the ordinary event loop: tokens stream to listeners,
and P/D moves real KV between instances without changing a token (HyperFlexis §5.1)."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from hfx.cluster.control import TokenEvent  # noqa: E402
from hfx.config import SimConfig  # noqa: E402
from hfx.engine.torch_executor import real_engine  # noqa: E402
from hfx.model.build import build_model  # noqa: E402
from hfx.request import SLO, Request  # noqa: E402
from hfx.sim.driver import sim_cluster  # noqa: E402
from hfx.stepmodel.latency import Profile, StepTimeModel  # noqa: E402

# A step-time model of the right order for the tiny model on CPU; only predictions use it.
MODEL = StepTimeModel(2e-3, 1e-5, 0.0, 2e-3, 1e-7, 3e-5)
SHAPE_META = {"model": {"name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
                        "intermediate": 128, "vocab": 512, "tp": 1}}


@pytest.fixture(scope="module")
def loaded():
    return build_model("tiny", device="cpu", seed=3)


def serve(loaded, config: SimConfig, requests: list[Request]) -> dict[str, list[TokenEvent]]:
    profile = Profile("tiny@cpu", MODEL, kv_capacity_tokens=8192, meta=SHAPE_META)
    heard: dict[str, list[TokenEvent]] = {r.id: [] for r in requests}

    async def go() -> None:
        control = sim_cluster(config, profile, lambda ecfg: real_engine(loaded.model, ecfg,
                                                                        step_model=MODEL))
        await control.start()
        for r in requests:
            control.submit(r, heard[r.id].append)
        await asyncio.wait_for(control.wait_idle(), 60)
        await control.stop()

    asyncio.run(go())
    return heard


def requests(n: int) -> list[Request]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(0, 512, (10 + 7 * i,), generator=gen).tolist()
        out.append(Request(f"r{i}", 0.0, len(ids), 6 + i, SLO(5.0, 1.0), prompt_token_ids=ids))
    return out


def tokens(events: list[TokenEvent]) -> list[int]:
    return [e.token for e in events if e.token is not None]


def test_listeners_hear_every_token_then_the_finish(loaded):
    reqs = requests(4)
    heard = serve(loaded, SimConfig(policy="hfx", instances=2), reqs)
    for r in reqs:
        events = heard[r.id]
        assert len(tokens(events)) == r.max_tokens
        assert events[-1] == TokenEvent(None, "length")


def test_pd_with_real_kv_gives_the_colocated_tokens(loaded):
    reqs = requests(4)
    colocated = serve(loaded, SimConfig(policy="rr", instances=1), reqs)
    pd = serve(loaded, SimConfig(policy="hfx", mode="pd", prefill=1, decode=2), reqs)
    for r in reqs:
        assert tokens(pd[r.id]) == tokens(colocated[r.id])
        assert pd[r.id][-1].finish_reason == "length"


def test_a_request_no_engine_can_serve_fails_with_the_reason(loaded):
    bad = Request("long", 0.0, 3, 9000, SLO(5.0, 1.0), prompt_token_ids=[1, 2, 3])
    heard = serve(loaded, SimConfig(policy="rr", instances=1), [bad, *requests(1)])
    assert heard["long"][-1].finish_reason == "error"
    assert "exceeds" in heard["long"][-1].error
    assert heard["r0"][-1].finish_reason == "length"


@pytest.mark.parametrize("path", ["d2d", "cpu", "disk"])
def test_serve_scales_out_with_weights_loaded_by_the_planned_path(path, caplog):
    """``hfx serve``'s Scaler starts a real instance whose weights come by the weight path
    (HyperFlexis §6) through the WeightManager: its own copy, equal to the running peer's, and the
    same greedy tokens from both."""
    from hfx.config import ServeConfig
    from hfx.serving.build import build_server

    server = build_server(ServeConfig(shape="tiny", device="cpu", instances=1, max_instances=2,
                                      weight_path=path, policy="rr", priorities=1))
    control = server.control

    async def go():
        await control.start()
        assert control.scaler.scale_out_now(control.instances[0].role, "test") == 1
        for _ in range(2000):
            if 1 in control.instances:
                break
            await asyncio.sleep(0.01)
        heard: dict[str, list[TokenEvent]] = {}
        for i in range(2):  # round robin: one on each instance
            heard[f"r{i}"] = []
            control.submit(Request(f"r{i}", asyncio.get_running_loop().time(), 5, 8,
                                   SLO(10.0, 10.0), prompt_token_ids=[7, 8, 9, 10, 11]),
                           heard[f"r{i}"].append)
        await asyncio.wait_for(control.wait_idle(), 60)
        await control.stop()
        return heard

    with caplog.at_level("INFO", logger="hfx.backends.engine_spec"):
        heard = asyncio.run(go())
    old, new = (control.instances[i].engine.executor.model for i in (0, 1))
    assert old is not new
    for (name, a), b in zip(old.state_dict().items(), new.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
        assert a.data_ptr() != b.data_ptr(), name  # a copy, not the same memory
    assert f"weights loaded by {path} (asked: {path})" in caplog.text
    assert [control.records[f"r{i}"].instance for i in range(2)] == [0, 1]
    assert [e.token for e in heard["r0"]] == [e.token for e in heard["r1"]]
