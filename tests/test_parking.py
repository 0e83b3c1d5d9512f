"""Deferrals parked out of other instances' scans (hfx/policies/parking.py): hidden from exactly the
instances that hold less of the prompt, and released as soon as an input of the verdict moves."""

from __future__ import annotations

import pytest

from hfx.engine.sequence import Role
from hfx.engine.stats import InstanceStats
from hfx.policies.base import InstanceView
from hfx.policies.maturity import MaturityQueue
from hfx.policies.parking import Parking
from hfx.policies.shadow import Shadows
from hfx.policies.slo_queue import SLOQueue
from hfx.request import SLO, Request
from hfx.stepmodel.latency import StepTimeModel

MODEL = StepTimeModel(0.02, 1e-4, 0.0, 0.03, 0.0, 1e-4)


def fleet(n: int = 3) -> tuple[Shadows, MaturityQueue]:
    shadows, maturity = Shadows(), MaturityQueue()
    for i in range(n):
        stats = InstanceStats(i, Role.COLOCATED, 0.0, 0, 0, 0, 0, 0, 100, 16, 0, 8, 0.0, 0)
        shadows.sync(InstanceView(i, Role.COLOCATED, stats))
    maturity.members(range(n), 0.0)
    maturity.set(1, 2.0)  # instance 1, where the requests are parked, matures at 2 s
    return shadows, maturity


def parked(top: tuple[int, ...] = (1,)) -> tuple[Parking, Shadows, MaturityQueue]:
    shadows, maturity = fleet()
    queue = SLOQueue()
    for rid in ("q", "r", "s"):  # r between two requests nobody parks
        queue.push(Request(rid, 0.0, 10, 1, SLO(1.0, 1.0)))
    p = Parking(ttl=0.05, queue=queue)
    p.park("r", 1, top, 0.0, shadows[1], 2.0, False, MODEL)
    return p, shadows, maturity


def skip(p: Parking, iid: int, now: float, shadows: Shadows, maturity: MaturityQueue,
         model: StepTimeModel = MODEL, new_round: bool = True) -> set[str]:
    """The queued requests instance ``iid``'s scan of Q_R does not see now (by default the
    first serve of a dispatcher call)."""
    queue = p._queue
    if new_round:
        p.new_round()
    p.refresh(now, shadows, maturity, False, model)
    seen = [r.id for r in queue.scan(10, p.asked_by(iid))]
    assert seen == sorted(seen)  # each in its place, shown again or asked for
    return {"q", "r", "s"} - set(seen)


def test_instances_that_hold_less_skip_it_and_those_that_hold_as_much_see_it():
    p, shadows, maturity = parked(top=(1, 2))  # 1 and 2 hold the most of it; 0 less
    assert skip(p, 0, 0.01, shadows, maturity) == {"r"}
    assert skip(p, 1, 0.01, shadows, maturity) == set()
    assert skip(p, 2, 0.01, shadows, maturity) == set()


def test_a_parking_ends_when_an_input_of_its_verdict_moves():
    # The view of the caches is read again after the TTL.
    p, shadows, maturity = parked()
    assert skip(p, 0, 0.049, shadows, maturity) == {"r"}
    assert skip(p, 0, 0.05, shadows, maturity) == set() and len(p) == 0
    # The instance's shadow changes (a dispatch there, a finish, a snapshot).
    p, shadows, maturity = parked()
    shadows[1].add(Request("x", 0.0, 10, 1, SLO(1.0, 1.0)), 1)
    assert skip(p, 0, 0.01, shadows, maturity) == set()
    # Its maturity moves, or it matures (the start is no longer its maturity).
    p, shadows, maturity = parked()
    maturity.set(1, 3.0)
    assert skip(p, 0, 0.01, shadows, maturity) == set()
    p, shadows, maturity = parked()
    p.park("r", 1, (1,), 1.99, shadows[1], 2.0, False, MODEL)  # a view read at 1.99 s
    assert skip(p, 0, 2.0, shadows, maturity) == {"r"}  # the start is still 2 s
    assert skip(p, 0, 2.001, shadows, maturity) == set()
    # Another step-time model (a calibration) or the request queued anew.
    p, shadows, maturity = parked()
    assert skip(p, 0, 0.01, shadows, maturity, MODEL.scaled(1.1)) == set()
    p, shadows, maturity = parked()
    p.unpark("r")
    assert skip(p, 0, 0.01, shadows, maturity) == set()


def test_parked_again_it_expires_with_its_newer_view():
    p, shadows, maturity = parked()
    p.park("r", 1, (1,), 0.04, shadows[1], 2.0, False, MODEL)
    assert skip(p, 0, 0.06, shadows, maturity) == {"r"}  # the first view's expiry passed
    assert skip(p, 0, 0.1, shadows, maturity) == set()


def test_within_a_call_the_instance_served_before_is_checked_again():
    # One dispatcher call serves instance 1, then 0: the serve of 1 dispatched there, so what
    # is parked on 1 is released before 0's scan.
    p, shadows, maturity = parked()
    assert skip(p, 1, 0.01, shadows, maturity) == set()  # 1 holds it: it asks for r
    shadows[1].add(Request("x", 0.0, 10, 1, SLO(1.0, 1.0)), 1)
    assert skip(p, 0, 0.01, shadows, maturity, new_round=False) == set() and len(p) == 0
    # Served without a change, it stays parked for the rest of the call.
    p, shadows, maturity = parked()
    assert skip(p, 1, 0.01, shadows, maturity) == set()
    assert skip(p, 0, 0.01, shadows, maturity, new_round=False) == {"r"}


def test_a_view_read_again_the_same_keeps_the_parking_and_a_new_one_ends_it():
    shadows, maturity = fleet()
    queue = SLOQueue()
    for rid in ("q", "r", "s"):
        queue.push(Request(rid, 0.0, 10, 1, SLO(1.0, 1.0)))
    same = {"r": True}
    reads: list[tuple[str, float]] = []

    def reread(rid: str, now: float) -> bool:
        reads.append((rid, now))
        return same[rid]

    p = Parking(ttl=0.05, queue=queue, reread=reread)
    p.park("r", 1, (1,), 0.0, shadows[1], 2.0, False, MODEL)
    assert skip(p, 0, 0.06, shadows, maturity) == {"r"} and reads == [("r", 0.06)]
    assert p.next_change() == pytest.approx(0.125)  # due at 0.11, on a grid of ttl / 2
    assert skip(p, 0, 0.1, shadows, maturity) == {"r"} and len(reads) == 1  # read at 0.06
    same["r"] = False  # the index moved
    assert skip(p, 0, 0.11, shadows, maturity) == set() and len(p) == 0
    assert p.next_change() is None
