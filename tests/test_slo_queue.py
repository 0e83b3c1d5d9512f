"""Q_R (hfx/policies/slo_queue.py): (TPOT, arrival) order, requests taken mid-scan, and what a
head that stays (a request parked for its cached instance) leaves behind it."""

from __future__ import annotations

from hfx.policies.slo_queue import SLOQueue
from hfx.request import SLO, Request


def req(i: int, tpot: float = 0.1) -> Request:
    return Request(f"r{i}", float(i), 10, 10, SLO(1.0, tpot))


def ids(q: SLOQueue, limit: int = 10, also: set[str] | None = None) -> list[str]:
    return [r.id for r in q.scan(limit, also)]


def test_scan_is_strictest_tpot_first_then_arrival() -> None:
    q = SLOQueue()
    for r in (req(0, 0.2), req(1, 0.1), req(2, 0.2), req(3, 0.1)):
        q.push(r)
    assert ids(q) == ["r1", "r3", "r0", "r2"]
    assert ids(q, 3) == ["r1", "r3", "r0"]
    assert q.min_tpot() == 0.1


def test_shortest_first_orders_each_class_by_prompt_then_arrival() -> None:
    q = SLOQueue(shortest_first=True)
    lengths = {0: 300, 1: 50, 2: 300, 3: 10, 4: 50}
    for i, n in lengths.items():
        q.push(Request(f"r{i}", float(i), n, 10, SLO(1.0, 0.2 if i == 4 else 0.1)))
    # The stricter TPOT class first, whatever its prompts; within it the shortest, then arrival.
    assert ids(q) == ["r3", "r1", "r0", "r2", "r4"]
    q.hide("r1")
    q.push(Request("r5", 5.0, 20, 10, SLO(1.0, 0.1)))
    q.show("r1")  # back in its place by length, behind the later but shorter r5
    assert ids(q) == ["r3", "r5", "r1", "r0", "r2", "r4"]
    # By the tokens it will compute where the caller knows them (a cached system prompt).
    q.push(Request("r6", 6.0, 5000, 10, SLO(1.0, 0.1)), length=15)
    assert ids(q)[:3] == ["r3", "r6", "r5"]


def test_hidden_requests_are_scanned_only_when_asked_for_in_their_places() -> None:
    q = SLOQueue()
    for r in (req(0, 0.2), req(1, 0.1), req(2, 0.2), req(3, 0.1), req(4, 0.1)):
        q.push(r)
    q.hide("r3")
    q.hide("r0")
    assert ids(q) == ["r1", "r4", "r2"]
    assert ids(q, 2) == ["r1", "r4"]  # hidden ones not counted
    assert len(q) == 5 and req(3) in q
    assert ids(q, also={"r0", "r3"}) == ["r1", "r3", "r4", "r0", "r2"]
    assert ids(q, also={"r3", "nobody"}) == ["r1", "r3", "r4", "r2"]
    for _ in range(3):  # compacted away from its FIFO, r3 keeps its place when shown
        ids(q)
    q.show("r3")
    assert ids(q) == ["r1", "r3", "r4", "r2"]
    # A hidden class still counts for the queue's strictest TPOT; taking a hidden request works.
    q.take(req(1, 0.1))
    q.take(req(3, 0.1))
    q.take(req(4, 0.1))
    q.hide("r2")
    assert ids(q) == [] and q.min_tpot() == 0.2
    q.take(req(2, 0.2))
    q.show("r0")
    assert ids(q) == ["r0"] and len(q) == 1


def test_requests_taken_behind_a_head_that_stays_are_dropped_once_they_outnumber_the_live() -> None:
    q = SLOQueue()
    rs = [req(i) for i in range(10)]
    for r in rs:
        q.push(r)
    for r in q.scan(10):
        if r.id not in ("r0", "r9"):
            q.take(r)  # r0, the head, stays queued: the taken are only marked
    assert [r.id for r in q.scan(10)] == ["r0", "r9"]
    assert len(q) == 2
    # The scan that saw 8 marked against 2 live rebuilt the FIFO: later scans walk 2 entries.
    assert [e.request.id for e in q._classes[0.1]] == ["r0", "r9"]
    q.take(rs[9])
    assert [r.id for r in q.scan(10)] == ["r0"]
    assert [e.request.id for e in q._classes[0.1]] == ["r0", "r9"]  # 1 dead of 2: left


def test_a_request_taken_and_queued_again_under_its_id_is_scanned() -> None:
    q = SLOQueue()
    rs = [req(i) for i in range(4)]
    for r in rs:
        q.push(r)
    q.take(rs[2])  # dispatched from behind the head, which stays
    q.push(req(2))  # resumed after its instance failed
    assert [r.id for r in q.scan(10)] == ["r0", "r1", "r3", "r2"]
    assert len(q) == 4
