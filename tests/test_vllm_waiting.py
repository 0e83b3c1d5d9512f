"""The waiting queue of HFX's scheduler inside vLLM (hfx.backends.vllm.waiting.py), with
stand-in requests: the order vLLM's scheduler gets from it, and the calls it makes on it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hfx.backends.vllm.waiting import DeadlineRequestQueue


@dataclass(eq=False)
class Req:
    request_id: str
    arrival_time: float
    ttft: float | None


def queue() -> DeadlineRequestQueue:
    return DeadlineRequestQueue(lambda r: None if r.ttft is None else r.arrival_time + r.ttft)


def ids(q: DeadlineRequestQueue) -> list[str]:
    return [r.request_id for r in q]


def test_earliest_ttft_deadline_first_then_the_late_and_those_without_one():
    q = queue()
    loose, none, tight = Req("loose", 0.0, 5.0), Req("none", 0.1, None), Req("tight", 0.2, 0.5)
    old = Req("old", 0.0, 1.0)
    for r in (loose, none, tight, old):
        q.add_request(r)
    assert ids(q) == ["tight", "old", "loose", "none"] and len(q) == 4
    q.settle(0.8)  # tight's deadline (0.7) has passed: it goes behind everything in time
    assert ids(q) == ["old", "loose", "none", "tight"]
    assert q.peek_request() is old and q.pop_request() is old
    # vLLM pops the requests a step skips and prepends them after it: one with a deadline goes
    # back by it, one without to the front of the late.
    assert [q.pop_request(), q.pop_request()] == [loose, none]
    q.prepend_requests([none, loose])
    assert ids(q) == ["loose", "none", "tight"]
    # A preempted request (prepend_request) goes before all of them, whatever its deadline.
    started = Req("started", 0.0, 9.0)
    q.prepend_request(started)
    assert ids(q) == ["started", "loose", "none", "tight"] and q.peek_request() is started


def test_remove_and_empty_queue_errors_as_vllms_queues_do():
    q = queue()
    a, b, c = Req("a", 0.0, 1.0), Req("b", 0.0, None), Req("c", 0.0, 2.0)
    for r in (a, b, c):
        q.add_request(r)
    q.remove_request(a)
    q.remove_requests({b})
    assert ids(q) == ["c"]
    assert q.pop_request() is c and not q
    with pytest.raises(IndexError):
        q.pop_request()
    with pytest.raises(IndexError):
        q.peek_request()
