"""The control plane's index of the instances' prefix caches (hfx/policies/prefix_index.py): fed
by each engine's own cache, it says what the engines would find; fed by routing, it is bounded
by the instances' KV."""

from __future__ import annotations

from hfx.engine.block_manager import BlockManager
from hfx.engine.sequence import Sequence
from hfx.policies.prefix_index import ENGINE, ESTIMATE, PrefixIndex
from hfx.request import Request


def request(rid: str, hashes: list[int], prompt: int | None = None) -> Request:
    return Request(rid, 0.0, prompt or 4 * len(hashes), 4, block_hashes=tuple(hashes),
                   hash_block=4)


def serve(kv: BlockManager, rid: str, hashes: list[int]) -> None:
    s = Sequence(rid, 4 * len(hashes), 4, block_hashes=tuple(hashes), hash_block=4)
    assert kv.allocate(s, s.num_tokens, 0, kv.cached_prefix(s))
    s.num_computed_tokens = s.num_tokens
    kv.free(s)


def test_an_engine_fed_index_says_what_each_engine_would_find():
    index = PrefixIndex(block_size=4)
    engines = {0: BlockManager(8, 4, block_ids=False), 1: BlockManager(8, 4, block_ids=False)}
    for iid, kv in engines.items():
        kv.listener = index.watch(iid)
    serve(engines[0], "a", [1, 2, 3, 4])
    serve(engines[1], "b", [1, 2, 9])
    serve(engines[1], "c", [7, 7, 7, 7, 7, 7])  # 6 of 8 blocks: 5 never used, b's tail evicted
    r = request("r", [1, 2, 3, 5, 6])
    assert index.match(r) == {0: 12, 1: 8}
    for iid, kv in engines.items():
        s = Sequence("probe", r.prompt_len, 1, block_hashes=r.block_hashes, hash_block=4)
        assert kv.cached_prefix(s) == index.match(r).get(iid, 0)
    assert index.sources == {0: ENGINE, 1: ENGINE}
    assert index.units_held(1) == len(engines[1].cached_keys())


def test_a_match_stops_at_each_instances_first_missing_unit_and_leaves_one_token():
    index = PrefixIndex(block_size=4)
    feeds = {i: index.watch(i) for i in (0, 1, 2)}
    keys, _ = index.keys(request("k", [1, 2, 3, 4]))
    for key in keys[:3]:
        feeds[0].stored(key)
    for key in keys[:1]:
        feeds[1].stored(key)
    feeds[2].stored(keys[1])  # a unit without its parent is no prefix
    assert index.match(request("x", [1, 2, 3, 4])) == {0: 12, 1: 4}
    index.forget("x")
    assert index.match(request("x", [1, 2, 3], prompt=12)) == {0: 8, 1: 4}  # the last token


def test_an_estimated_instance_keeps_what_was_routed_within_its_kv():
    index = PrefixIndex(block_size=4)
    index.estimate(0, kv_blocks=6)
    index.routed(0, request("a", [1, 2, 3, 4]))
    index.routed(0, request("b", [5, 6, 7, 8]))  # 8 units routed, room for 6: a's first two go
    assert index.units_held(0) == 6 and index.sources[0] == ESTIMATE
    assert index.match(request("a2", [1, 2, 3, 4, 9])) == {}
    assert index.match(request("b2", [5, 6, 7, 8, 9])) == {0: 16}
    index.routed(0, request("a3", [1, 2]))  # touched again: most recent
    assert index.match(request("a4", [1, 2, 9])) == {0: 8}


def test_an_instance_that_leaves_takes_its_entries_with_it():
    index = PrefixIndex(block_size=4)
    feed = index.watch(0)
    keys, _ = index.keys(request("k", [1, 2, 3]))
    for key in keys:
        feed.stored(key)
    index.drop(0)
    assert index.match(request("r", [1, 2, 3, 4])) == {} and index.units_held(0) == 0
    assert not index._holders


def test_a_simulated_fleet_feeds_its_index_from_every_engine():
    """After a run, the index holds exactly the units the engines hold."""
    from hfx.config import SimConfig
    from hfx.sim.clock import run
    from hfx.sim.driver import load_requests, resolve_profile, run_cluster

    config = SimConfig(workload="shared-prompts", qps=3, duration=30.0, instances=2,
                       policy="least-loaded")
    control, _ = run(run_cluster(config, load_requests(config), resolve_profile(config), False),
                     virtual=True)
    index = control.fleet.prefix
    assert index is not None
    for iid, inst in control.instances.items():
        assert set(inst.engine.kv.cached_keys()) == index._held[iid]
        assert len(index._held[iid]) > 100


def test_each_dispatch_counts_what_the_index_says_the_instance_holds():
    index = PrefixIndex(block_size=4)
    index.estimate(0, kv_blocks=64)
    index.estimate(1, kv_blocks=64)
    index.routed(0, request("a", [1, 2, 3, 4]))  # nothing held yet
    index.routed(0, request("b", [1, 2, 3, 9]))  # 12 of its tokens held at 0
    index.routed(1, request("c", [1, 2, 3, 9]))  # none at 1
    index.routed(0, Request("d", 0.0, 16, 4))  # no content: nothing to say
    assert index.predicted_hits == {0: 12, 1: 0}


def test_a_match_is_read_again_only_when_a_key_it_walked_moved():
    """The same dict while nothing it depends on moved (what lets a waiting request's view be
    kept, hfx.py's MATCH_TTL); a fresh one, and right, as soon as a walked key moves."""
    index = PrefixIndex(block_size=4)
    feeds = {i: index.watch(i) for i in (0, 1)}
    keys, _ = index.keys(request("k", [1, 2, 3, 4, 5]))
    for key in keys[:2]:
        feeds[0].stored(key)
    r = request("r", [1, 2, 3, 4, 5])
    first = index.match(r)
    assert first == {0: 8}
    feeds[1].stored(keys[4])  # past where the walk stopped (key 2 is held by none): the same
    assert index.match(r) is first
    feeds[0].stored(keys[2])  # the key the walk stopped at: read again
    second = index.match(r)
    assert second == {0: 12} and second is not first and index.match(r) is second
    feeds[1].stored(keys[0])  # a walked key gains a holder
    assert index.match(r) == {0: 12, 1: 4}
    feeds[0].removed(keys[1])  # a walked key loses one
    assert index.match(r) == {0: 4, 1: 4}
    for key in keys:  # every holder gone, then back: read again each time
        feeds[0].removed(key)
        feeds[1].removed(key)
    assert index.match(r) == {}
    feeds[1].stored(keys[0])
    assert index.match(r) == {1: 4}
    index.forget("r")  # the id again, for another prompt: nothing kept of the old one
    assert index.match(request("r", [9, 9])) == {}
