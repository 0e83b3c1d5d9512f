"""A stage's wake-ups: the policy is called when it asked to be, once per asked time."""

from __future__ import annotations

import asyncio

from hfx.cluster.stage import Stage
from hfx.policies import ClusterView, Decision
from hfx.policies.base import ArrivalOrderPolicy
from hfx.sim.clock import run
from hfx.stepmodel.latency import StepTimeModel, load_profile


class Scripted(ArrivalOrderPolicy):
    """A policy that answers each call with the next wake time of its script."""

    name = "scripted"

    def __init__(self, wakes: list[float | None]) -> None:
        super().__init__()
        self.wakes = iter(wakes)
        self.calls: list[float] = []

    def schedule(self, view: ClusterView) -> Decision:
        self.calls.append(view.now)
        return Decision(wake_at=next(self.wakes, None))


def calls(wakes: list[float | None], external: list[float]) -> list[float]:
    """Times the policy was called: at 0, at each ``external`` time (an arrival, a finish),
    and whenever its wake-ups fire."""
    policy = Scripted(wakes)
    view = ClusterView(0.0, [], StepTimeModel(0, 0, 0, 0, 0, 0), load_profile("tiny@cpu"))
    stage = Stage("test", policy, view, lambda decision, now: None)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        stage.schedule()
        for t in external:
            loop.call_at(t, stage.schedule)
        await asyncio.sleep(100.0)
        stage.stop()

    run(go(), virtual=True)
    return policy.calls


def test_the_same_wake_time_asked_twice_wakes_the_policy_once():
    assert calls([5.0, 5.0, None], external=[1.0]) == [0.0, 1.0, 5.0]


def test_a_later_answer_moves_the_wake_up():
    assert calls([5.0, 7.0, None], external=[1.0]) == [0.0, 1.0, 7.0]
    assert calls([5.0, None], external=[1.0]) == [0.0, 1.0]  # no wake-up asked: none fires


def test_a_policy_woken_that_asks_for_now_again_is_called_again():
    # At 5 the policy's wake-up fires and it asks for 5 again (work it could not finish at
    # once): the fired timer is spent, so a new one must be armed for it.
    assert calls([5.0, 5.0, None], external=[]) == [0.0, 5.0, 5.0]
