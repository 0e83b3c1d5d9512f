"""Prompts that repeat, served by real vLLM (the ``vllm`` tier; issues 46 and 47): prefix
caching stays on at the servers, which publish their KV events; HFX's index follows each
server's blocks from them (stored, and evicted as the server evicts), sends a conversation's
next turn to the server that holds its history, whose own prefix-cache counter then rises, and
drops what a server held once it is gone; the records keep each prompt's block hashes, never
its text."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.vllm

from helpers.vllm_tier import ARGS, PYTHON, vllm_metrics, wait_for  # noqa: E402

# isort: split
from helpers.live import Running  # noqa: E402

from hfx.backends.vllm.kv_events import APPLIED, MALFORMED  # noqa: E402
from hfx.policies.prefix_index import EVENTS  # noqa: E402
from hfx.request import SLO, Request  # noqa: E402

HISTORY = "You are a careful assistant for a shipping company. " * 12  # ~600 byte tokens


@pytest.fixture(scope="module")
def gw(mini_checkpoint, tmp_path_factory):
    record = tmp_path_factory.mktemp("rec") / "served.jsonl"
    running = Running(engine="vllm", checkpoint=mini_checkpoint, instances=2,
                      vllm_python=PYTHON, vllm_args=ARGS, kv_capacity_tokens=16384,
                      max_model_len=2048, policy="hfx", max_wait=None, record=str(record))
    running.record_path = record
    yield running
    running.close()


def hits(gw) -> dict[int, float]:
    return {iid: vllm_metrics(b.url).get("vllm:prefix_cache_hits_total", 0.0)
            for iid, b in gw.server.control.instances.items()}


def ask(gw, prompt: str) -> None:
    r = gw.client.completions.create(model=gw.model, prompt=prompt, max_tokens=4,
                                     extra_body={"slo": {"ttft_ms": 20000, "tpot_ms": 5000},
                                                 "ignore_eos": True})
    assert r.usage.completion_tokens == 4


def holding(index) -> list[int]:
    return [iid for iid in index.sources if index.units_held(iid)]


def test_the_next_turn_goes_to_the_server_that_holds_its_history(gw):
    index = gw.server.control.fleet.prefix
    assert index is not None and set(index.sources.values()) == {EVENTS}
    ask(gw, HISTORY + "Where is parcel 1?")
    size = gw.server.control.profile.block_size
    # The server's BlockStored events reach the index a message's latency after the response.
    wait_for(lambda: sum(index.units_held(i) for i in index.sources) >= len(HISTORY) // size,
             30, "the KV events of the first turn", lambda: dict(index.sources))
    assert len(holding(index)) == 1
    holder = holding(index)[0]
    events = gw.server.control.instances[holder].events
    assert events.counts[APPLIED] > 0 and events.counts[MALFORMED] == 0
    before = hits(gw)
    for turn in range(3):
        ask(gw, HISTORY + f"Where is parcel 1? It left on day {turn}. And parcel 2?")
    after = hits(gw)
    # Every later turn found the history at the holder, none at the other server.
    wait_for(lambda: hits(gw)[holder] >= before[holder] + 3 * 16 * (len(HISTORY) // 16 - 1),
             30, "vLLM's hit counter at the holder", lambda: (before, hits(gw)))
    other = 1 - holder
    assert after[other] == before[other]


def test_the_index_follows_what_a_server_evicts(gw):
    index = gw.server.control.fleet.prefix
    holder = holding(index)[0]
    ids = gw.server.tokenizer.encode(HISTORY + "Where is parcel 1?")
    first = Request("probe", 0.0, len(ids), 1, SLO(1.0, 1.0), prompt_token_ids=ids)
    assert index.match(first).get(holder, 0) > 0
    # Distinct prompts, twice both servers' KV together: the least recently used blocks go.
    for i in range(30):
        ask(gw, f"Manifest {i:03d}: " + "".join(f"crate {i}-{j} weighs {j * 7 % 97} kg; "
                                                for j in range(60))[:1800])
    # The first conversation's history, least recently used at its holder, left the index.
    wait_for(lambda: index.match(first).get(holder, 0) == 0, 30,
             "the holder's BlockRemoved events", lambda: index.match(first))
    for iid in index.sources:
        assert 0 < index.units_held(iid) <= gw.server.control.instances[iid].info.kv_total_blocks


def test_a_server_that_is_gone_holds_nothing_in_the_index(gw):
    index = gw.server.control.fleet.prefix
    iid = holding(index)[0]
    gw.server.control.instances[iid].process.kill()
    wait_for(lambda: iid not in index.sources, 60, "the index to drop the killed server",
             lambda: dict(index.sources))
    assert index.units_held(iid) == 0


def test_the_record_keeps_block_hashes_and_no_text(gw):
    ask(gw, HISTORY + "And parcel 3?")
    # The servers' block size (vLLM's CPU build aligns the 16 asked to its kernels' 32).
    size = gw.server.control.profile.block_size
    gw.close()  # the record is flushed when the server stops
    rows = [json.loads(line) for line in gw.record_path.read_text().splitlines()]
    assert rows and all(r["hash_block"] == size and len(r["block_hashes"]) ==
                        -(-r["input_len"] // size) for r in rows)
    assert "prompt_token_ids" not in rows[0] and HISTORY[:40] not in json.dumps(rows)
    # The turns sharing the history (the first row's and those after it that begin as it
    # does) share its full blocks' hashes; the manifests, which share none, none of them.
    full = len(HISTORY) // size
    turns = [r for r in rows if r["block_hashes"][0] == rows[0]["block_hashes"][0]]
    assert len(turns) == 5 and len({tuple(r["block_hashes"][:full]) for r in turns}) == 1
