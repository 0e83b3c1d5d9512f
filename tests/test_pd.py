"""P/D disaggregation: migration invariants, KV pressure, links, and the stages end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from conftest import make_engine, seq

from hfx.cluster.control import ControlPlane
from hfx.cluster.tl_manager import TLManager
from hfx.config import SimConfig
from hfx.engine import RequestStatus, Role
from hfx.request import Outcome
from hfx.sim.clock import run
from hfx.sim.driver import drive, load_requests, resolve_profile, sim_cluster, simulate


def test_transfer_time_is_bytes_over_bandwidth_plus_latency():
    tl = TLManager(kv_bytes_per_token=57344, tp=1, devices_per_node=8)
    for p in (0, 1):
        tl.add_prefill(p)
    tl.add_decode(2)
    tl.add_decode(9)  # node 1
    assert set(tl.links) == {(0, 2), (1, 2), (0, 9), (1, 9)}  # every pair, set up in advance
    # 1000 tokens · 57344 B over HCCS 720 Gb/s = 90 GB/s, plus 0.5 ms.
    assert tl.transfer_time(0, 2, 1000) == pytest.approx(57344e3 / 90e9 + 0.5e-3)
    # Across nodes: 200 GbE = 25 GB/s.
    assert tl.transfer_time(0, 9, 1000) == pytest.approx(57344e3 / 25e9 + 0.5e-3)
    # One link carries one transfer at a time.
    first = tl.book(0, 2, 1000, now=10.0)
    second = tl.book(0, 2, 1000, now=10.0)
    assert second == pytest.approx(first + tl.transfer_time(0, 2, 1000))
    tl.add_prefill(3)  # a new instance gets links before it serves
    assert (3, 2) in tl.links and (3, 9) in tl.links
    with pytest.raises(KeyError, match="no link"):
        tl.book(2, 0, 10, 0.0)


def _prefilled(vloop, *specs: tuple[str, int, int]):
    """A prefill engine that has prefilled (request id, prompt, max tokens) of each spec and
    holds them for migration."""
    prefill, _ = make_engine(role=Role.PREFILL, num_blocks=64)
    for rid, prompt, out in specs:
        prefill.add_request(seq(rid, prompt, out))

    async def prefill_all():
        while prefill.has_work():
            await prefill.step()

    vloop.run_until_complete(prefill_all())
    return prefill


def test_reserve_import_waits_rather_than_overcommits(vloop):
    prefill = _prefilled(vloop, ("a", 12, 5), ("b", 12, 5))
    decode, _ = make_engine(role=Role.DECODE, num_blocks=5, block_size=4, watermark=0.0)
    assert set(prefill.held) == {"a", "b"}
    assert decode.reserve_import(prefill.held["a"].migrated_copy())  # 13 tokens: 4 of 5 blocks
    used = decode.kv.num_used_blocks
    assert not decode.reserve_import(prefill.held["b"].migrated_copy())  # no room: refused
    assert decode.kv.num_used_blocks == used and "b" not in decode.incoming  # nothing taken
    prefill.release("a")
    decode.activate_import("a")
    assert decode.state.running[0].request_id == "a"
    assert decode.state.running[0].status is RequestStatus.RUNNING


def test_imports_wait_for_a_sequence_slot(vloop):
    """An import counts against max_num_seqs like any request: with 2 slots, the third KV to
    arrive waits, holding its blocks, and starts decoding when a slot frees (FIFO)."""
    prefill = _prefilled(vloop, ("a", 4, 2), ("b", 4, 9), ("c", 4, 9), ("d", 4, 9))
    decode, _ = make_engine(role=Role.DECODE, num_blocks=64, max_num_seqs=2)
    for rid in "abcd":
        assert decode.reserve_import(prefill.held[rid].migrated_copy())
        prefill.release(rid)
        decode.activate_import(rid)
    assert [s.request_id for s in decode.state.running] == ["a", "b"]
    assert list(decode.ready) == ["c", "d"] and decode.num_waiting == 2
    assert decode.kv.num_used_blocks == 8  # every import's KV is held meanwhile

    out = vloop.run_until_complete(decode.step())  # "a" decodes its last token
    assert out.request_ids == ["a", "b"] and ("a", RequestStatus.FINISHED_LENGTH) in \
        out.transitions
    out = vloop.run_until_complete(decode.step())  # the freed slot goes to "c", not "d"
    assert out.request_ids == ["b", "c"] and list(decode.ready) == ["d"]


def test_aborting_an_import_frees_its_kv(vloop):
    """Aborted while its KV is on the way, or while it waits for a slot: dropped, KV freed."""
    prefill = _prefilled(vloop, ("a", 4, 9), ("b", 4, 9), ("c", 4, 9))
    decode, _ = make_engine(role=Role.DECODE, num_blocks=64, max_num_seqs=1)
    for rid in "abc":
        assert decode.reserve_import(prefill.held[rid].migrated_copy())
    for rid in "ab":
        decode.activate_import(rid)
    assert list(decode.ready) == ["b"] and list(decode.incoming) == ["c"]
    decode.abort("b")
    decode.abort("c")
    out = vloop.run_until_complete(decode.step())
    assert ("b", RequestStatus.FINISHED_ABORTED) in out.transitions
    assert ("c", RequestStatus.FINISHED_ABORTED) in out.transitions
    assert not decode.ready and not decode.incoming
    assert decode.kv.num_used_blocks == decode.get("a").num_blocks


def _sim_beside(cfg: SimConfig,
                watcher: Callable[[ControlPlane], Awaitable[None]]) -> ControlPlane:
    """Simulate ``cfg`` with ``watcher(control)`` running beside it; returns the control."""
    async def main():
        control = sim_cluster(cfg, resolve_profile(cfg))
        task = asyncio.ensure_future(watcher(control))
        await drive(control, load_requests(cfg))
        task.cancel()
        return control

    return run(main(), virtual=True)


def _blocks(engine, seq) -> int:
    """The KV blocks ``seq`` holds, read without syncing it: a decode cohort member's count
    trails its crossings until synced (hfx/engine/cohort.py)."""
    cohort = engine.state.cohort
    return cohort.blocks(seq) if cohort is not None and seq.in_cohort else seq.num_blocks


def test_migration_invariants_under_kv_pressure():
    """Every 5 ms: no request decodes on two instances; a migrated request is on its decode
    instance and its KV nowhere else; no instance holds more KV than it has. Decode KV is
    small, so migrations must wait."""
    cfg = SimConfig(mode="pd", policy="rr-pd", prefill=2, decode=2, qps=60,
                    requests_per_task=25, kv_capacity_tokens=6000, monitor_interval=0.2)
    violations: list[str] = []
    waited = []

    async def watch(control) -> None:
        while True:
            await asyncio.sleep(0.005)
            engines = {i: inst.engine for i, inst in control.instances.items()}
            where: dict[str, list[int]] = {}
            for iid, e in engines.items():
                if e.kv.num_used_blocks > e.kv.num_blocks:
                    violations.append(f"instance {iid} over capacity")
                owned = sum(_blocks(e, s) for s in e._seqs.values())
                if owned != e.kv.num_used_blocks:
                    violations.append(f"instance {iid}: blocks owned {owned} != used")
                for s in e.state.running:
                    where.setdefault(s.request_id, []).append(iid)
            for rid, ids in where.items():
                if len(ids) > 1:
                    violations.append(f"{rid} decoding on {ids}")
            for rid, rec in control.records.items():
                if rec.migrated_at is not None and rec.outcome is Outcome.PENDING:
                    holders = [i for i, e in engines.items()
                               if rid in e._seqs and _blocks(e, e._seqs[rid])]
                    # On its decode instance only; none while preempted there (recompute).
                    if holders not in ([rec.decode_instance], []) or \
                            rid not in engines[rec.decode_instance]._seqs:
                        violations.append(f"{rid} KV on {holders}")
            waited.append(len(control.migration.blocked))

    control = _sim_beside(cfg, watch)
    assert violations == []
    assert max(waited) > 0, "decode KV should have run short and made migrations wait"
    assert all(r.outcome is Outcome.FINISHED for r in control.records.values())
    assert all(r.decode_instance is not None and r.decode_instance >= 2
               for r in control.records.values())
    for inst in control.instances.values():
        assert inst.engine.kv.num_used_blocks == 0  # everything freed at the end


def test_aborts_during_kv_transfer_and_slot_wait_leave_the_rest_served():
    """Clients that leave while their KV is on the link, or while it waits on the decode
    instance for a sequence slot (4 of them here), end as aborted with their KV freed; the
    decode instances stay up and every other request finishes. (An abort during the transfer
    used to raise inside the decode engine's step and fail the whole instance.)"""
    cfg = SimConfig(mode="pd", policy="rr-pd", prefill=2, decode=2, qps=80,
                    requests_per_task=25, max_num_seqs=4)
    aborted = {"transfer": set(), "slot": set()}

    async def leave(control) -> None:
        while True:
            await asyncio.sleep(0.0005)
            for rid, rec in list(control.records.items()):
                if rec.outcome is not Outcome.PENDING or rec.decode_instance is None:
                    continue
                engine = control.instances[rec.decode_instance].engine
                where = ("transfer" if rid in engine.incoming
                         else "slot" if rid in engine.ready else None)
                if where and len(aborted[where]) < 5 and int(rid.rsplit("-", 1)[-1]) % 3 == 0:
                    aborted[where].add(rid)
                    control.abort(rid)

    control = _sim_beside(cfg, leave)
    assert len(aborted["transfer"]) == 5 and len(aborted["slot"]) == 5
    gone = aborted["transfer"] | aborted["slot"]
    outcomes = {rid: r.outcome for rid, r in control.records.items()}
    assert {outcomes[rid] for rid in gone} == {Outcome.ABORTED}
    assert all(o is Outcome.FINISHED for rid, o in outcomes.items() if rid not in gone)
    assert len(outcomes) == 100
    for inst in control.instances.values():
        assert inst.engine.kv.num_used_blocks == 0 and not inst.engine.ready


@pytest.mark.parametrize("policy", ["hfx", "rr-pd", "least-loaded"])
def test_pd_policies_serve_everything(policy):
    r = simulate(SimConfig(mode="pd", policy=policy, qps=100, requests_per_task=30))
    assert r["mode"] == "pd" and r["instances"] == 4 and r["prefill_instances"] == 2
    assert r["finished"] == r["requests"] == 120
    assert r["migrations"] == 120  # every request moved once
    assert r["migration_delay"]["mean"] > 0
    # Qwen2.5-7B: 57,344 bytes of KV per token, prompt tokens only.
    assert r["kv_bytes_moved"] > 120 * 20 * 57344


def test_pd_config_errors():
    with pytest.raises(ValueError, match="P/D policy"):
        SimConfig(mode="pd", policy="scorpio")
    assert SimConfig(mode="pd", policy="rr").policy == "rr"  # an alias of rr-pd


def test_an_aborted_request_leaves_the_migrators_queue_at_once():
    """Clients that leave while their prefilled requests wait in HFX's Migrator queue: each
    request leaves the queue as it ends. It used to stay until the Migrator placed it, which
    counted it in its shadow of the decode instance, where it never arrived nor finished: with
    four sequence slots, five such aborts stalled the decode stage for good."""
    cfg = SimConfig(mode="pd", policy="hfx", prefill=2, decode=1, qps=80,
                    requests_per_task=25, max_num_seqs=4)
    aborted: list[str] = []
    lingered: list[str] = []

    def queued(control) -> set[str]:
        return {r.id for r in control.migration.stage.policy.queue.scan(10**6)}

    async def leave(control) -> None:
        while True:
            await asyncio.sleep(0.0005)
            if control.migration is None:
                continue
            waiting = queued(control)
            lingered.extend(rid for rid in aborted if rid in waiting
                            and control.records[rid].outcome is not Outcome.PENDING)
            for rid in sorted(waiting):
                if len(aborted) < 5 and rid not in aborted:
                    aborted.append(rid)
                    control.abort(rid)

    control = _sim_beside(cfg, leave)
    assert len(aborted) == 5
    assert {control.records[rid].outcome for rid in aborted} == {Outcome.ABORTED}
    assert lingered == []
    assert sum(r.outcome is Outcome.FINISHED for r in control.records.values()) == 95


def test_a_blocked_migration_leaves_no_request_in_hfxs_decode_shadows():
    """HFX's Migrator counts a placement in its shadow of the decode instance. When the KV is
    not free there after all, the migration waits and is placed again later, maybe elsewhere:
    the first placement must leave that shadow, or it holds a sequence slot for good."""
    cfg = SimConfig(mode="pd", policy="hfx", prefill=2, decode=2, qps=60,
                    requests_per_task=25, kv_capacity_tokens=3000, monitor_interval=0.2)
    blocked: list[int] = []

    async def watch(control) -> None:
        while True:
            await asyncio.sleep(0.005)
            if control.migration is not None:
                blocked.append(len(control.migration.blocked))

    control = _sim_beside(cfg, watch)
    assert max(blocked) > 0, "decode KV should have run short and made migrations wait"
    assert all(r.outcome is Outcome.FINISHED for r in control.records.values())
    shadows = control.migration.stage.policy.shadow
    assert {i: list(shadows[i].inflight) for i in (2, 3)} == {2: [], 3: []}
