"""vLLM's KV events into the prefix index: the translation of vLLM's block hashes into HFX's keys,
what is dropped and counted instead, the ZeroMQ subscription, and the fall-back when a stream
goes silent. The messages are built as vLLM 0.32's ZmqEventPublisher sends them
(vllm/distributed/kv_events.py); tests/test_vllm_prefix.py checks them against a real server.
"""

from __future__ import annotations

import asyncio
import logging

import msgpack
import pytest

from hfx.backends.vllm.instance import SILENT_SECONDS, VLLMInstance
from hfx.backends.vllm.kv_events import (
    APPLIED,
    MALFORMED,
    MISSED,
    ORPHAN,
    OUT_OF_ORDER,
    SKIPPED,
    UNKNOWN,
    KVEventSubscriber,
    KVEventTranslator,
)
from hfx.backends.vllm.metrics import ServerInfo
from hfx.policies.prefix_index import ESTIMATE, EVENTS, PrefixIndex
from hfx.request import SLO, Request

BS = 4  # tokens per block
PROMPT = list(range(100, 113))  # 13 tokens: three full blocks


def stored(hashes: list[bytes], tokens: list[int], parent: bytes | None = None,
           medium: str = "GPU", **extra: object) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": BS, "lora_id": None, "medium": medium,
            "lora_name": None, **extra}


def removed(hashes: list[bytes]) -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def message(seq: int, *events: dict) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big", signed=True), msgpack.packb([1.0, list(events), None])]


def h(i: int) -> bytes:
    return bytes([i]) * 32  # vLLM's sha256 block hashes are 32 bytes


def request(rid: str = "r") -> Request:
    return Request(rid, 0.0, len(PROMPT), 4, SLO(1.0, 0.1), prompt_token_ids=PROMPT)


def setup() -> tuple[PrefixIndex, KVEventTranslator]:
    index = PrefixIndex(BS)
    return index, KVEventTranslator(index.watch(0, EVENTS), BS)


def test_stored_blocks_are_keyed_as_hfx_keys_a_prompt_so_the_request_matches():
    index, tr = setup()
    # The first two blocks in one event, the third (child of the second) in the next.
    tr.on_message(message(0, stored([h(1), h(2)], PROMPT[:8])))
    assert index.match(request()) == {0: 8}
    tr.on_message(message(1, stored([h(3)], PROMPT[8:12], parent=h(2))))
    assert index.match(request()) == {0: 12}
    assert tr.blocks == 3 and tr.counts[APPLIED] == 2
    # Evicting the middle block cuts the prefix there.
    tr.on_message(message(2, removed([h(2)])))
    assert index.match(request()) == {0: 4}
    tr.on_message(message(3, {"type": "AllBlocksCleared"}))
    assert index.match(request()) == {} and index.units_held(0) == 0


def test_other_tokens_under_the_same_parent_do_not_match():
    index, tr = setup()
    tr.on_message(message(0, stored([h(1)], PROMPT[:4]), stored([h(9)], [7, 7, 7, 7],
                                                                  parent=h(1))))
    assert index.match(request()) == {0: 4}


def test_what_cannot_be_applied_is_counted_and_never_reaches_the_index():
    index, tr = setup()
    tr.on_message(message(0, stored([h(3)], PROMPT[8:12], parent=h(2))))  # parent never seen
    tr.on_message(message(1, removed([h(5)])))  # a block never seen
    tr.on_message(message(2, stored([h(1)], PROMPT[:4], medium="CPU")))  # offloaded copy
    tr.on_message(message(3, stored([h(1)], PROMPT[:4], extra_keys=[("salt",)])))
    tr.on_message(message(4, stored([h(1)], PROMPT[:3])))  # tokens short of the block
    tr.on_message(message(5, {"type": "Bogus"}, {"no": "type"}, 17))
    tr.on_message([b"", b"\x00" * 8])  # two frames
    tr.on_message([b"", (6).to_bytes(8, "big"), b"\xc1"])  # not msgpack
    tr.on_message(message(6, stored([h(1)], PROMPT[:4])))  # a sequence number seen
    assert index.units_held(0) == 0 and index.match(request()) == {}
    assert (tr.counts[ORPHAN], tr.counts[UNKNOWN], tr.counts[SKIPPED]) == (1, 1, 2)
    assert tr.counts[MALFORMED] == 1 + 3 + 1 + 1 and tr.counts[OUT_OF_ORDER] == 1
    # It goes on: the next message applies.
    tr.on_message(message(9, stored([h(1)], PROMPT[:4])))
    assert index.match(request()) == {0: 4} and tr.counts[MISSED] == 2


def test_a_restarted_server_numbering_from_zero_again_holds_nothing_of_before():
    index, tr = setup()
    tr.on_message(message(0, stored([h(1), h(2)], PROMPT[:8])))
    tr.on_message(message(1, stored([h(3)], PROMPT[8:12], parent=h(2))))
    tr.on_message(message(0, stored([h(7)], [1, 2, 3, 4])))
    assert index.match(request()) == {} and tr.blocks == 1


def test_the_array_form_of_older_releases_is_read():
    index, tr = setup()
    tr.on_message(message(0, ["BlockStored", [h(1)], None, PROMPT[:4], BS, None, "GPU"]))
    assert index.match(request()) == {0: 4}
    tr.on_message(message(1, ["BlockRemoved", [h(1)], "GPU"]))
    assert index.match(request()) == {}


def test_the_subscriber_feeds_the_index_from_a_publisher_socket():
    import zmq
    import zmq.asyncio

    async def main() -> dict[int, int]:
        index, tr = setup()
        pub = zmq.asyncio.Context.instance().socket(zmq.PUB)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub = KVEventSubscriber(f"tcp://127.0.0.1:{port}", tr)
        sub.start()
        try:
            for seq in range(200):  # a PUB drops what it sends before the SUB has joined
                await pub.send_multipart(message(seq, stored([h(1)], PROMPT[:4])))
                await asyncio.sleep(0.01)
                if sub.last_at is not None:
                    break
            assert sub.last_at is not None
            return index.match(request())
        finally:
            await sub.stop()
            pub.close(linger=0)

    assert asyncio.run(main()) == {0: 4}


class _Silent:
    """A subscriber that hears nothing."""

    endpoint = "tcp://127.0.0.1:1"
    last_at: float | None = None

    def cancel(self) -> None:
        self.cancelled = True


def test_a_silent_stream_while_the_server_computes_falls_back_to_the_estimate(caplog):
    async def main() -> list[str]:
        index = PrefixIndex(BS)
        inst = VLLMInstance(0, "http://x", ServerInfo("m", 64, 100, BS), 8,
                            kv_events="tcp://127.0.0.1:1")
        loop = asyncio.get_running_loop()
        assert inst.watch_cache(index.watch(0, EVENTS), lambda: index.fall_back(0, 100))
        await inst._subscriber.stop()
        silent = inst._subscriber = _Silent()
        seen = []
        base = loop.time()
        for t, computed in ((0.0, 0), (SILENT_SECONDS + 1, BS),  # too little computed
                            (SILENT_SECONDS + 2, 2 * BS)):
            inst._watched_at = base - t  # as if the index had followed it for t seconds
            inst._check_events({"vllm:prefix_cache_queries_total": computed})
            seen.append(index.sources[0])
        assert silent.cancelled
        return seen

    with caplog.at_level(logging.WARNING):
        seen = asyncio.run(main())
    assert seen == [EVENTS, EVENTS, ESTIMATE]
    assert "no KV event" in caplog.text and "estimate" in caplog.text


def test_a_stream_that_speaks_is_kept_while_the_server_computes():
    async def main() -> str:
        index = PrefixIndex(BS)
        inst = VLLMInstance(0, "http://x", ServerInfo("m", 64, 100, BS), 8,
                            kv_events="tcp://127.0.0.1:1")
        loop = asyncio.get_running_loop()
        inst.watch_cache(index.watch(0, EVENTS), lambda: index.fall_back(0, 100))
        await inst._subscriber.stop()
        speaking = inst._subscriber = _Silent()
        for i in range(1, 6):
            speaking.last_at = loop.time() - 1.0  # a message a second ago
            inst._watched_at = loop.time() - 100.0 * i
            inst._check_events({"vllm:prefix_cache_queries_total": 100 * BS * i})
        return index.sources[0]

    assert asyncio.run(main()) == EVENTS


@pytest.mark.parametrize("on", [True, False])
def test_servers_hfx_starts_publish_their_kv_events_where_it_subscribes(on, tmp_path):
    from hfx.backends.vllm.process import VLLMLaunch, VLLMServer

    launch = VLLMLaunch("python", "m", "m", 64, 8, 1024, 16, kv_events=on, log_dir=tmp_path)
    server = VLLMServer(launch, 0, 1)
    cmd = launch.command(server.port, server.events_port)
    if on:
        config = cmd[cmd.index("--kv-events-config") + 1]
        assert f'"endpoint": "tcp://*:{server.events_port}"' in config
        assert server.kv_events == f"tcp://127.0.0.1:{server.events_port}"
    else:
        assert "--kv-events-config" not in cmd and server.kv_events is None
