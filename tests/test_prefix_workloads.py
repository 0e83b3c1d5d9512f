"""Workloads whose prompts repeat (issue 46): chat sessions, shared system prompts, agent loops,
their content hashes, repeat_share, and a Mooncake trace of sessions read back."""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict

import numpy as np
import pytest

from hfx.request import Request
from hfx.workloads.sessions import (
    AGENT,
    CHAT,
    HASH_BLOCK,
    KINDS,
    MAX_CONTEXT,
    SHAPES,
    SHARED,
    SLO_OF_KINDS,
    TASK_SPECS,
    _apps,
    draw_rows,
    generate,
    repeat_share,
    to_requests,
)
from hfx.workloads.tasks import TASKS


@pytest.fixture(scope="module")
def drawn() -> dict[str, list[Request]]:
    """Each kind's first 1,500 requests at 2 requests/s, seed 3."""
    return {kind: generate(kind, 2.0, 3, 1500) for kind in KINDS}


def by_unit(requests: list[Request]) -> dict[str, list[Request]]:
    """Requests per unit (``{kind}-{unit}-{step}``), in step order."""
    units: dict[str, list[Request]] = defaultdict(list)
    for r in requests:
        unit = r.id.rpartition("-")[0]
        units[unit].append(r)
    for rs in units.values():
        rs.sort(key=lambda r: int(r.id.rpartition("-")[2]))
    return units


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


# ---- every kind ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_requests_are_well_formed(drawn, kind):
    reqs = drawn[kind]
    assert len(reqs) == 1500
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0
    assert len({r.id for r in reqs}) == len(reqs)
    assert {(r.task, r.slo, r.hash_block, r.priority) for r in reqs} == {
        (kind, TASKS["sharegpt"].slo, HASH_BLOCK, None)}
    for r in reqs:
        # The hashes cover prompt and output exactly (the request checked they may).
        assert len(r.block_hashes) == math.ceil((r.prompt_len + r.max_tokens) / HASH_BLOCK)
        assert all(0 <= h < 1 << 63 for h in r.block_hashes)
        assert r.prompt_len + r.max_tokens <= MAX_CONTEXT


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_for_a_seed_and_apart_across_seeds(drawn, kind):
    assert generate(kind, 2.0, 3, 1500) == drawn[kind]  # every field, hashes included
    other = generate(kind, 2.0, 4, 1500)
    assert [r.arrival for r in other] != [r.arrival for r in drawn[kind]]
    # No block of one seed's content names a block of the other's.
    ours = {h for r in drawn[kind] for h in r.block_hashes}
    assert not ours & {h for r in other for h in r.block_hashes}


@pytest.mark.parametrize("kind", KINDS)
def test_the_stream_cut_by_count_or_by_duration_is_one_stream(kind):
    first = generate(kind, 3.0, 5, 300)
    window = generate(kind, 3.0, 5, 1, duration=first[-1].arrival + 1e-9)
    assert window[:300] == first
    assert all(r.arrival <= first[-1].arrival for r in window)


@pytest.mark.parametrize("kind", KINDS)
def test_mean_rate_is_the_qps(kind):
    reqs = generate(kind, 2.0, 1, 1, duration=3000.0)
    assert 0.9 < len(reqs) / 3000.0 / 2.0 < 1.1
    assert reqs[-1].arrival < 3000.0


@pytest.mark.parametrize("kind", KINDS)
def test_qps_moves_units_starts_not_their_content(kind):
    slow, fast = (draw_rows(SHAPES[kind], qps, 2, units=300) for qps in (1.0, 2.0))
    order = np.lexsort((slow.step, slow.unit)), np.lexsort((fast.step, fast.unit))
    for column in ("unit", "step", "prompt", "output", "app", "shared"):
        assert np.array_equal(getattr(slow, column)[order[0]], getattr(fast, column)[order[1]])
    assert not np.array_equal(slow.arrival[order[0]], fast.arrival[order[1]])


def test_task_specs_name_the_kinds_and_summarise_them():
    from hfx.workloads.kinds import Repeating, kind_of, load_workload, workload_tasks

    for kind in KINDS:
        assert isinstance(kind_of(kind), Repeating)
        (spec,) = workload_tasks(kind)
        assert spec == TASK_SPECS[kind] and spec.name == kind and spec.slo == SLO_OF_KINDS
        reqs = load_workload(kind, 4.0, 0, requests_per_task=6000)
        assert len(reqs) == 6000 and {r.task for r in reqs} == {kind}
        prompt = np.array([r.prompt_len for r in reqs])
        output = np.array([r.max_tokens for r in reqs])
        assert prompt.mean() == pytest.approx(spec.input_mean, rel=0.1)
        assert output.mean() == pytest.approx(spec.output_mean, rel=0.1)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown workload 'chat'"):
        generate("chat", 1.0, 0, 10)
    with pytest.raises(ValueError, match="qps must be positive"):
        generate(CHAT, 0.0, 0, 10)
    with pytest.raises(ValueError, match="requests_per_task must be >= 1"):
        generate(CHAT, 1.0, 0, 0)
    with pytest.raises(ValueError, match="duration must be positive"):
        generate(CHAT, 1.0, 0, 10, duration=-1.0)


# ---- chat-sessions ------------------------------------------------------------------------------
def test_a_turn_resends_the_history_and_its_answer(drawn):
    pairs = 0
    for turns in by_unit(drawn[CHAT]).values():
        for prev, nxt in itertools.pairwise(turns):
            assert int(nxt.id.rpartition("-")[2]) == int(prev.id.rpartition("-")[2]) + 1
            covered = prev.prompt_len + prev.max_tokens
            full = covered // HASH_BLOCK
            # The next prompt is the history (prompt and answer) and a new user message ...
            assert nxt.prompt_len > covered and nxt.arrival > prev.arrival
            # ... so its hashes start with every full block of the previous prompt and answer,
            assert nxt.block_hashes[:full] == prev.block_hashes[:full]
            # and not with the previous turn's partial last block: it holds more tokens now.
            if covered % HASH_BLOCK:
                assert nxt.block_hashes[full] != prev.block_hashes[full]
            pairs += 1
    assert pairs > 800  # most of the 1,500 are later turns


def test_conversations_share_nothing(drawn):
    firsts = [turns[0].block_hashes[0] for turns in by_unit(drawn[CHAT]).values()]
    assert len(set(firsts)) == len(firsts)


# ---- shared-prompts -----------------------------------------------------------------------------
def test_requests_of_an_app_share_its_system_prompt_and_no_more():
    shape = SHAPES[SHARED]
    rows = draw_rows(shape, 2.0, 3, count=400)
    reqs = to_requests(SHARED, rows, 3, shape.tag)
    system = _apps(shape, 3).system
    assert np.array_equal(rows.shared, system[rows.app])
    share = 1 / np.arange(1, 17)
    assert np.allclose(_apps(shape, 3).share, share / share.sum())  # Zipf(1) over 16
    apps = rows.app.tolist()
    assert apps.count(0) > 0.22 * len(apps) and apps.count(0) > 4 * apps.count(7)
    for (a, ra), (b, rb) in itertools.combinations(list(zip(apps, reqs, strict=True))[:120], 2):
        shared = common_prefix(ra.block_hashes, rb.block_hashes)
        assert shared == (system[a] // HASH_BLOCK if a == b else 0), (ra.id, rb.id)
        assert ra.prompt_len > system[a]


# ---- agent-loops --------------------------------------------------------------------------------
def test_a_step_resends_the_loop_and_its_tool_call(drawn):
    pairs = 0
    for steps in by_unit(drawn[AGENT]).values():
        for prev, nxt in itertools.pairwise(steps):
            covered = prev.prompt_len + prev.max_tokens
            full = covered // HASH_BLOCK
            # Previous prompt + its tool call + the tool's result (at least a token).
            assert nxt.prompt_len > covered and nxt.arrival > prev.arrival
            assert nxt.block_hashes[:full] == prev.block_hashes[:full]
            if covered % HASH_BLOCK:
                assert nxt.block_hashes[full] != prev.block_hashes[full]
            pairs += 1
    assert pairs > 500


def test_loops_of_an_agent_share_its_system_prompt():
    shape = SHAPES[AGENT]
    rows = draw_rows(shape, 2.0, 3, count=600)
    reqs = to_requests(AGENT, rows, 3, shape.tag)
    system = _apps(shape, 3).system
    first = {}  # each loop's first request seen
    for app, unit, r in zip(rows.app.tolist(), rows.unit.tolist(), reqs, strict=True):
        first.setdefault(unit, (app, r))
    loops = list(first.values())[:60]
    for (a, ra), (b, rb) in itertools.combinations(loops, 2):
        assert common_prefix(ra.block_hashes, rb.block_hashes) == (
            system[a] // HASH_BLOCK if a == b else 0)


# ---- repeat_share -------------------------------------------------------------------------------
def test_repeat_share_counts_prompt_blocks_whose_prefix_came_before():
    def req(i, arrival, prompt, output, hashes, g=16):
        return Request(f"r{i}", arrival, prompt, output, block_hashes=hashes, hash_block=g)

    reqs = [
        req(0, 0.0, 40, 24, (1, 2, 3, 4)),  # 3 prompt blocks, none seen before; output covers 4
        req(1, 1.0, 64, 1, (1, 2, 3, 4, 9)),  # 4 prompt blocks: all 4 seen (4 was r0's answer)
        req(2, 2.0, 32, 1, (7, 2, 5)),  # 2: the chain 7 is new, so 2 after it is too
        req(3, 3.0, 40, 24, (1, 2), g=32),  # 2: another granularity, never met
        Request("r4", 4.0, 48, 1),  # 3 blocks with no hashes: never repeat
        req(5, 5.0, 48, 1, (1, 2, 6, 8)),  # 3: 1, 2 repeat, 6 does not
        req(6, 6.0, 48, 1, (7, 2, 3)),  # 3: 7, 2 as r2's; 3 came third only after 1, 2
    ]
    assert repeat_share(reqs) == pytest.approx(
        (0 + 4 + 0 + 0 + 0 + 2 + 2) / (3 + 4 + 2 + 2 + 3 + 3 + 3))
    assert repeat_share(reversed(reqs)) == repeat_share(reqs)  # arrival order, not list order
    assert repeat_share([]) == 0.0


def test_repeat_shares_are_in_range(drawn):
    # Measured: 0.710, 0.544, 0.885 (seed 3, the first 1,500 requests at 2/s, 13 minutes: some
    # turns' histories began before 0, uncached). An hour at 2/s, seed 0: 0.865, 0.506, 0.910.
    shares = {kind: repeat_share(reqs) for kind, reqs in drawn.items()}
    assert 0.65 < shares[CHAT] < 0.78
    assert 0.45 < shares[SHARED] < 0.62
    assert 0.84 < shares[AGENT] < 0.93
    # Without its hashes a workload repeats nothing.
    bare = [Request(r.id, r.arrival, r.prompt_len, r.max_tokens) for r in drawn[CHAT]]
    assert repeat_share(bare) == 0.0


# ---- a Mooncake trace of sessions ---------------------------------------------------------------
def test_session_trace_reads_back_through_read_trace(tmp_path, capsys):
    from bench.sim.make_session_trace import main, make
    from hfx.workloads.traces import detect_format, load_rows, parse_slo_map, read_trace

    out = tmp_path / "sessions.jsonl"
    assert main(["--sessions", "40", "--qps", "1", "--seed", "2", "--apps", "3", "--out",
                 str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == make(40, 1.0, 2, 3)[0]
    assert detect_format(out) == "mooncake"
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    # Hash ids are numbered in order of first appearance, as Mooncake's.
    seen = list(dict.fromkeys(h for r in rows for h in r["hash_ids"]))
    assert seen == list(range(len(seen)))
    reqs = read_trace(out, slo_map=parse_slo_map("default=2000:500"))
    assert len(reqs) == len(rows) == printed["requests"] == len(load_rows(out).rows)
    assert sorted((r.prompt_len, r.max_tokens, r.block_hashes) for r in reqs) == sorted(
        (r["input_length"], r["output_length"], tuple(r["hash_ids"])) for r in rows)
    assert {r.hash_block for r in reqs} == {512}
    assert printed["repeat_share"] == round(repeat_share(reqs), 4)
    assert 0.6 < printed["repeat_share"] < 0.95


def test_default_session_trace_repeats_near_the_issues_81_percent(tmp_path):
    from bench.sim.make_session_trace import make
    from hfx.workloads.traces import parse_slo_map, read_trace

    out = tmp_path / "t.jsonl"
    rows = make(600, 2.0, 0)[0]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    share = repeat_share(read_trace(out, slo_map=parse_slo_map("default=2000:500")))
    assert 0.74 < share < 0.86
