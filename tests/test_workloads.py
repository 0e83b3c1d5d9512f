"""Table 1 workloads and trace files."""

from __future__ import annotations

import numpy as np
import pytest

from hfx.request import SLO
from hfx.workloads.load import generate, load_trace
from hfx.workloads.task_draws import lognormal_lengths
from hfx.workloads.tasks import TASKS
from hfx.workloads.traces import TraceError


def test_four_task_set_equal_shares_and_table1_slos():
    reqs = generate("four-task", qps=8.0, seed=1)
    assert len(reqs) == 1200
    tasks = {r.task for r in reqs}
    assert tasks == {"medical_qa", "tldr_content_gen", "tldr_headline_gen", "wikisql"}
    assert all(sum(r.task == t for r in reqs) == 300 for t in tasks)
    assert all(r.slo == TASKS[r.task].slo for r in reqs)
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals)
    # Poisson at 2 QPS per task: 300 requests span about 150 s.
    span = max(r.arrival for r in reqs if r.task == "wikisql")
    assert 110 < span < 190


def test_wikisql_alone_uses_the_single_task_slo():
    reqs = generate("wikisql", qps=4.0, seed=0, requests_per_task=10)
    assert {r.slo for r in reqs} == {SLO(0.7, 0.5)}


def test_same_seed_same_stream_other_seed_other_stream():
    a = generate("two-task", 4.0, seed=3)
    b = generate("two-task", 4.0, seed=3)
    c = generate("two-task", 4.0, seed=4)
    key = lambda rs: [(r.id, r.arrival, r.prompt_len, r.max_tokens) for r in rs]  # noqa: E731
    assert key(a) == key(b) and key(a) != key(c)


@pytest.mark.parametrize("name", list(TASKS))
def test_lengths_match_table1_moments(name):
    t = TASKS[name]
    rng = np.random.default_rng(0)
    x = lognormal_lengths(rng, t.input_mean, t.input_std, 200_000)
    assert x.min() >= 1
    assert x.mean() == pytest.approx(t.input_mean, rel=0.05)
    assert x.std() == pytest.approx(t.input_std, rel=0.12)


def test_unknown_workload_lists_valid_ones():
    with pytest.raises(ValueError, match="four-task, two-task, wikisql"):
        generate("nope", 1.0, 0)


def test_jsonl_and_csv_traces(tmp_path):
    j = tmp_path / "t.jsonl"
    j.write_text('{"arrival": 0.5, "input_len": 10, "output_len": 3, "ttft": 1, "tpot": 0.1}\n'
                 '\n{"arrival": 0.1, "input_len": 5, "output_len": 2, "task": "gsm8k"}\n')
    reqs = load_trace(j)
    assert [r.arrival for r in reqs] == [0.1, 0.5]
    assert reqs[0].slo == TASKS["gsm8k"].slo and reqs[1].slo == SLO(1.0, 0.1)
    c = tmp_path / "t.csv"
    c.write_text("arrival,input_len,output_len,ttft,tpot,task,priority\n"
                 "0.0,12,4,0.7,0.2,chat,1\n")
    (r,) = load_trace(c)
    assert (r.prompt_len, r.max_tokens, r.task, r.priority) == (12, 4, "chat", 1)


@pytest.mark.parametrize("line, message", [
    ('{"arrival": 0, "input_len": 10}', "missing required field 'output_len'"),
    ('{"arrival": 0, "input_len": "ten", "output_len": 1, "task": "gsm8k"}', "not a number"),
    ('{"arrival": 0, "input_len": 1.5, "output_len": 1, "task": "gsm8k"}', "whole number"),
    ('{"arrival": -1, "input_len": 1, "output_len": 1, "task": "gsm8k"}', ">= 0"),
    ('{"arrival": 0, "input_len": 0, "output_len": 1, "task": "gsm8k"}', ">= 1"),
    ('{"arrival": 0, "input_len": 1, "output_len": 1, "ttft": 1}', "both ttft and tpot"),
    ('{"arrival": 0, "input_len": 1, "output_len": 1, "task": "gsm8k", "x": 1}', "unknown field"),
    ('{"arrival": 0, "input_len": 1,', "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
])
def test_bad_jsonl_row_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"arrival": 0, "input_len": 1, "output_len": 1, "task": "gsm8k"}\n' + line)
    with pytest.raises(TraceError, match=message) as e:
        load_trace(path)
    assert f"{path}:2:" in str(e.value)


def test_bad_csv_rows_name_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("arrival,input_len,output_len,task\n0,1,1,gsm8k\n0,1,1,gsm8k,extra\n")
    with pytest.raises(TraceError, match=f"{path}:3: more values"):
        load_trace(path)
    path.write_text("arrival,input_len\n0,1\n")
    with pytest.raises(TraceError, match="header lacks"):
        load_trace(path)
    with pytest.raises(TraceError, match="no such trace"):
        load_trace(tmp_path / "missing.csv")


def test_each_workload_name_is_taken_by_its_kind_and_unknown_ones_list_every_kind():
    from hfx.workloads.kinds import Bursty, Ramp, TaskSets, Tiered, Traces, kind_of

    expected = {"four-task": TaskSets, "six-task": TaskSets, "ramp": Ramp,
                "tiered-512-512": Tiered, "bursty-four-task": Bursty, "my.jsonl": Traces,
                "run.csv": Traces}
    assert {name: type(kind_of(name)) for name in expected} == expected
    with pytest.raises(ValueError) as e:
        kind_of("four_task")
    for needle in ("four-task", "ramp", "tiered-4096-1024", "bursty-four-task", ".jsonl"):
        assert needle in str(e.value)


def test_kinds_that_set_their_own_arrivals_refuse_a_duration():
    from hfx.workloads.kinds import load_workload

    for name in ("ramp", "trace.jsonl"):
        with pytest.raises(ValueError, match="--duration applies to task sets"):
            load_workload(name, 4.0, 0, duration=10.0)
    # A bursty set without a duration runs whole 40 s cycles, as many as its requests take
    # at the mean rate (4 tasks × 200 at 10/s: 80 s, two cycles; × 50: 20 s, still one).
    for per_task, cycles in ((50, 1), (200, 2)):
        last = max(r.arrival for r in load_workload("bursty-four-task", 10.0, 0,
                                                    requests_per_task=per_task))
        assert 40.0 * cycles - 10 < last < 40.0 * cycles


def _rows_sorted(tasks, key, arrivals_of):
    """The merge as a list of rows sorted on (arrival, task order, index): what a
    RequestStream must give, built independently."""
    import zlib

    from hfx.request import Request

    rows = []
    for order, task in enumerate(tasks):
        rng = np.random.default_rng([key[0], zlib.crc32(task.name.encode()), *key[1:]])
        times = arrivals_of(order, task, rng)
        ins = lognormal_lengths(rng, task.input_mean, task.input_std, len(times))
        outs = lognormal_lengths(rng, task.output_mean, task.output_std, len(times))
        rows += [(float(t), order, i, Request(f"{task.name}-{i}", float(t), int(ins[i]),
                                               int(outs[i]), task.slo, task.name))
                 for i, t in enumerate(times)]
    return [r[3] for r in sorted(rows, key=lambda r: r[:3])]


def test_a_request_stream_builds_the_merge_in_order_ties_included():
    from hfx.workloads.load import RequestStream
    from hfx.workloads.tasks import WORKLOADS

    tasks = WORKLOADS["four-task"]
    # Equal arrival times across and within tasks: ties go by task order, then index.
    def arrivals(order, task, rng):
        return [2.0, 0.5, 2.0, float(order)]
    s = RequestStream(tasks, [7, 1], arrivals)
    s.rows.block = 3  # rows turned into Python numbers 3 at a time
    want = _rows_sorted(tasks, [7, 1], arrivals)
    assert len(s) == len(want) == 16
    assert list(s) == want
    assert s[3] == want[3] and s[-1] == want[-1] and s[2:9:3] == want[2:9:3]
    assert [s[i] for i in (15, 0, 7, 6, 12)] == [want[i] for i in (15, 0, 7, 6, 12)]
    with pytest.raises(IndexError):
        s[16]
    by_task = {t.name: p for p, t in enumerate(tasks)}
    prio = s.with_priorities(by_task)
    assert [(r.priority, r.slo) for r in prio] == [(by_task[r.task], None) for r in want]
    assert list(s) == want  # the original keeps its SLOs
    with pytest.raises(ValueError, match="no priority"):
        s.with_priorities({})


def test_the_simulator_reads_a_task_set_as_a_stream():
    from hfx.config import SimConfig
    from hfx.sim.driver import load_requests
    from hfx.workloads.load import RequestStream

    cfg = SimConfig(workload="two-task", qps=20, duration=30, priorities=2)
    got = load_requests(cfg)
    assert isinstance(got, RequestStream)
    want = generate("two-task", 20, 0, duration=30)
    assert [(r.id, r.arrival, r.prompt_len, r.max_tokens) for r in got] == \
        [(r.id, r.arrival, r.prompt_len, r.max_tokens) for r in want]
    assert {r.priority for r in got} == {0, 1} and {r.slo for r in got} == {None}


def test_arrivals_submit_each_request_at_its_own_time_in_order():
    import asyncio

    from hfx.request import Request
    from hfx.sim.clock import run
    from hfx.workloads.arrivals import Arrivals

    requests = [Request(f"r{i}", t, 8, 4) for i, t in enumerate([0.0, 0.0, 1.5, 1.5, 3.0])]

    async def main(reqs: list[Request]) -> list[tuple[float, str]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[float, str]] = []
        done = loop.create_future()
        Arrivals(loop, lambda r: seen.append((loop.time(), r.id)), reqs.__getitem__,
                 len(reqs), done).start()
        await done
        return seen

    assert run(main(requests), virtual=True) == [(r.arrival, r.id) for r in requests]
    assert run(main([]), virtual=True) == []  # nothing to submit: done at once


@pytest.mark.parametrize("draw", [7, 100])
@pytest.mark.parametrize("seed", range(4))
def test_a_stream_drawn_in_chunks_is_the_stream_drawn_whole(seed, draw):
    from hfx.workloads.load import RequestStream, poisson_until
    from hfx.workloads.task_draws import counted_chunks, poisson_chunks
    from hfx.workloads.tasks import WORKLOADS

    tasks = WORKLOADS["four-task"]
    # poisson_until draws blocks of rate·duration gaps, a second one when the first falls
    # short: chunks of 7 cut every block, and some seeds need the second block.
    for key, chunks, whole in [
        ([seed, 3], poisson_chunks(2.5, 40.0, draw),
         lambda o, t, rng: poisson_until(rng, 2.5, 40.0)),
        ([seed], counted_chunks(2.5, 90, draw),
         lambda o, t, rng: np.cumsum(rng.exponential(1 / 2.5, 90)))]:
        s = RequestStream(tasks, key, chunks, draw)
        s.rows.block = 13
        want = _rows_sorted(tasks, key, whole)
        assert len(s) == len(want) and s.last_arrival == want[-1].arrival
        assert list(s) == want
        assert [s[i] for i in (len(want) - 1, 0, 50, 49)] == \
            [want[i] for i in (len(want) - 1, 0, 50, 49)]  # reading back draws again


def test_chunks_merge_with_ties_across_their_edges():
    from hfx.workloads.load import RequestStream
    from hfx.workloads.tasks import WORKLOADS

    tasks = WORKLOADS["four-task"][:3]
    given = {0: [[0.0, 1.0, 1.0], [1.0], [1.0, 2.0]], 1: [[1.0], [1.0, 3.0]], 2: [[]]}

    def chunks(order, task, rng):
        yield from (np.asarray(c) for c in given[order])

    s = RequestStream(tasks, [5], chunks, draw=2)
    s.rows.block = 2
    got = [(r.arrival, r.task, int(r.id.rsplit("-", 1)[1])) for r in s]
    assert got == sorted(got, key=lambda r: (r[0], [t.name for t in tasks].index(r[1]), r[2]))
    assert len(got) == 9 and s.last_arrival == 3.0
    want = _rows_sorted(tasks, [5], lambda o, t, rng: [x for c in given[o] for x in c])
    assert list(s) == want

    def backwards(order, task, rng):
        yield from (np.asarray(c) for c in ([2.0], [1.0]))

    with pytest.raises(ValueError, match="out of order"):
        RequestStream(tasks, [5], backwards)
