"""The cache-aware routers users would pick instead of HFX (docs/peers.md), each deciding as its
source does with its shipped defaults."""

from __future__ import annotations

from hfx.engine import Role
from hfx.engine.stats import InstanceStats
from hfx.policies import ClusterView, InstanceView, make_policy
from hfx.request import SLO, Request, RequestRecord
from hfx.stepmodel.latency import Profile, StepTimeModel

PROFILE = Profile("t", StepTimeModel(0.02, 1e-4, 0.0, 0.03, 0.0, 1e-4), kv_capacity_tokens=100_000)


class FixedCache:
    def __init__(self, hits: dict[str, dict[int, int]]) -> None:
        self.hits = hits

    def match(self, request: Request) -> dict[int, int]:
        return self.hits.get(request.id, {})


def view(n: int, hits: dict[str, dict[int, int]] | None = None, running: tuple[int, ...] = (),
         outstanding: tuple[int, ...] = (), kv_used: tuple[int, ...] = (),
         waiting_blocks: tuple[int, ...] = ()) -> ClusterView:
    insts = []
    for i in range(n):
        stats = InstanceStats(i, Role.COLOCATED, 0.0, 0, running[i] if running else 0, 0,
                              kv_used[i] if kv_used else 0,
                              waiting_blocks[i] if waiting_blocks else 0, 6250, 16, 0, 256,
                              0.0, 0)
        insts.append(InstanceView(i, Role.COLOCATED, stats,
                                  outstanding=outstanding[i] if outstanding else 0))
    v = ClusterView(0.0, insts, PROFILE.model, PROFILE)
    v.prefix = FixedCache(hits or {})
    return v


def req(rid: str, hashes: list[int], prompt: int | None = None) -> Request:
    return Request(rid, 0.0, prompt or 16 * len(hashes), 8, SLO(2.0, 0.5),
                   block_hashes=tuple(hashes), hash_block=16)


def route(policy, v: ClusterView, *requests: Request) -> list[int]:
    for r in requests:
        policy.enqueue(r, 0.0)
    return [d.instance for d in policy.schedule(v).dispatch]


def test_llm_d_weighs_its_prefix_scorer_against_queue_and_kv_as_shipped():
    # Precise index: instance 1 holds 3/4 of the prompt. Scores 3·p + 2·q + 2·(1 − kv):
    # equal queues and KV: 1 wins on its prefix (2.25 more).
    pol = make_policy("llm-d", index="precise")
    assert route(pol, view(2, {"r": {1: 48}}), req("r", [1, 2, 3, 4])) == [1]
    # Instance 1 has 3 waiting and 0 has none: queue scores 1 and 0 (min-max); 0 gets 2 for
    # its queue against 1's 2.25 for the prefix: 1 still wins; with a full KV (usage 1) on 1
    # as well, 0 wins (2 + 2 > 2.25 + 0).
    busy = view(2, {"r": {1: 48}}, outstanding=(0, 3))
    assert route(make_policy("llm-d", index="precise"), busy, req("r", [1, 2, 3, 4])) == [1]
    full = view(2, {"r": {1: 48}}, outstanding=(0, 3), kv_used=(0, 6250))
    assert route(make_policy("llm-d", index="precise"), full, req("r", [1, 2, 3, 4])) == [0]


def test_llm_d_approx_learns_where_it_routed_a_prefix():
    pol = make_policy("llm-d")
    v = view(4)
    first = route(pol, v, req("a", [1, 2, 3, 4, 5, 6, 7, 8]))
    # The same prefix again, all instances otherwise equal: its own index sends it back.
    assert route(pol, v, req("b", [1, 2, 3, 4, 5, 6, 7, 9])) == first


def test_dynamo_takes_the_lowest_prefill_plus_decode_blocks():
    # A 64-token prompt (4 blocks): instance 1 has 48 tokens cached: prefill 1 block there
    # against 4; decode blocks alike (4 new, nothing in flight). Cost 5 against 8.
    pol = make_policy("dynamo")
    assert route(pol, view(2, {"r": {1: 48}}), req("r", [1, 2, 3, 4])) == [1]
    # Instance 1's engine has 10 blocks of prompts waiting (160 tokens): 1 + 10 + 4 = 15
    # against 8: instance 0.
    pol = make_policy("dynamo")
    waiting = view(2, {"r": {1: 48}}, waiting_blocks=(0, 10))
    assert route(pol, waiting, req("r", [1, 2, 3, 4])) == [0]


def test_dynamo_counts_the_blocks_in_flight_once_and_lets_them_go_at_the_finish():
    pol = make_policy("dynamo")
    a = req("a", [1, 2, 3, 4])
    [at] = route(pol, view(2), a)  # a tie: at random (seeded)
    after = view(2)
    after.version = 1  # a snapshot since: a's prefill is the engine's, and done
    # b shares a's 4 units in flight: 5 unique blocks on either instance once placed, and the
    # same prefill: a tie, to the instance whose index holds fewer blocks.
    assert route(pol, after, req("b", [1, 2, 3, 4, 5])) == [1 - at]
    assert sorted(pol._blocks[at].values()) == [1, 1, 1, 1]
    # c shares nothing: 4 blocks in flight on a's instance and 5 on b's: c goes to a's.
    assert route(pol, after, req("c", [7, 8, 9, 10, 11])) == [at]
    pol.on_finished(RequestRecord(a), after)
    assert sorted(pol._blocks[at].values()) == [1] * 5  # a's units gone, c's stay


def test_sglang_balances_past_its_thresholds_else_follows_the_longest_match():
    pol = make_policy("sglang")
    v = view(2)
    assert route(pol, v, req("a", [1, 2, 3, 4])) == [0]  # no match: the smallest tree (a tie)
    assert route(pol, v, req("b", [1, 2, 3, 9])) == [0]  # 3/4 matched > 0.3: the holder
    assert route(pol, v, req("c", [5, 6, 7, 8])) == [1]  # no match: 1's tree is the smaller
    # 0 has 100 in flight, 1 has 30: 70 > 64 and 100 > 1.5·30: the least loaded, match or not.
    assert route(pol, view(2, outstanding=(100, 30)), req("d", [1, 2, 3, 4, 5])) == [1]
    # 100 against 40: 60 ≤ 64, balanced enough: the match decides.
    assert route(pol, view(2, outstanding=(100, 40)), req("e", [1, 2, 3, 4, 6])) == [0]


def test_sglang_counts_prompts_without_content_in_the_smallest_tree():
    # SGLang inserts every prompt's text into its tree: a prompt with no content (the synthetic
    # task workloads) is text of its own length, so the next one goes to the other worker.
    pol = make_policy("sglang")
    v = view(2)

    def plain(rid: str, prompt: int) -> Request:
        return Request(rid, 0.0, prompt, 8, SLO(2.0, 0.5))

    assert route(pol, v, plain("a", 640)) == [0]  # both trees empty: the first
    assert route(pol, v, plain("b", 160)) == [1]  # 0 holds 40 blocks, 1 none
    assert route(pol, v, plain("c", 160)) == [1]  # 40 against 10
    assert route(pol, v, plain("d", 480)) == [1]  # 40 against 20
    assert route(pol, v, plain("e", 16)) == [0]  # 40 against 50


def test_prefix_aware_follows_the_longest_routed_prefix_and_ignores_load():
    pol = make_policy("prefix-aware")
    first = route(pol, view(4), req("a", [1, 2, 3, 4]))[0]
    loaded = view(4, outstanding=tuple(500 if i == first else 0 for i in range(4)))
    assert route(pol, loaded, req("b", [1, 2, 3, 9])) == [first]
    # Nothing matches: uniform over all (seeded), so different instances over many requests.
    got = {route(pol, view(4), req(f"n{i}", [100 + i, 7]))[0] for i in range(20)}
    assert len(got) > 1
