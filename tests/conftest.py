from __future__ import annotations

import asyncio

import pytest

from hfx.engine import EngineConfig, EngineCore, Sequence
from hfx.engine.planners.base import SchedulerOutput


class RecordingExecutor:
    """A fake executor: takes ``step_time`` on the loop's clock and remembers every plan."""

    def __init__(self, step_time: float = 0.01, tokens: dict[str, list[int]] | None = None):
        self.step_time = step_time
        self.plans: list[dict[str, int]] = []
        self.tokens = tokens  # request id → tokens to sample in order (None: placeholders)

    async def execute(self, out: SchedulerOutput):
        self.plans.append({s.request_id: n for s, n in out.num_scheduled_tokens.items()})
        await asyncio.sleep(self.step_time)
        if self.tokens is None:
            return None
        return {s: self.tokens[s.request_id][len(s.output_token_ids)]
                for s, n in out.num_scheduled_tokens.items()
                if s.num_computed_tokens + n >= s.num_tokens}


def make_engine(num_blocks: int = 64, block_size: int = 4, **kw) -> tuple[EngineCore,
                                                                            RecordingExecutor]:
    executor = RecordingExecutor(tokens=kw.pop("tokens", None))
    model = kw.pop("step_model", None)
    return EngineCore(EngineConfig(num_kv_blocks=num_blocks, block_size=block_size, **kw),
                      executor, model), executor


def seq(rid: str, prompt: int, out: int, **kw) -> Sequence:
    return Sequence(request_id=rid, prompt_len=prompt, max_tokens=out, **kw)


@pytest.fixture
def vloop():
    from hfx.sim.clock import VirtualTimeLoop

    loop = VirtualTimeLoop()
    yield loop
    loop.close()


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/*.json from the current code")


@pytest.fixture(scope="session")
def mini_checkpoint(tmp_path_factory) -> str:
    """Random weights of the ``mini`` shape (the smallest vLLM's CPU attention runs) with the
    byte tokenizer, written once per session: what the vLLM tier's servers load."""
    pytest.importorskip("torch")
    from hfx.model.build import write_random_checkpoint

    return str(write_random_checkpoint("mini", tmp_path_factory.mktemp("mini")))

