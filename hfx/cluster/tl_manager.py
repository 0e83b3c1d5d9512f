"""TLManager: KV transfer links between prefill and decode instances (HyperFlexis §5.1, §6;
HFX paper §3.4).

Links between every prefill and every decode instance are set up in advance — when the fleet
starts and when an instance joins — so that no migration pays for an on-demand setup (HyperFlexis
§6, contrasting Mooncake). A transfer of n tokens takes

    n · kv_bytes_per_token / bandwidth + latency

with kv_bytes_per_token = layers × 2 × KV heads × head dim × dtype bytes (from the model config),
and the bandwidth of the link: within a node HCCS at 720 Gb/s, across nodes 200 GbE RoCE (HFX paper
§4.1). Transfers on one link run one after another (FIFO), so a busy link delays the next one.
Instance i sits on node ⌊i · tp / devices_per_node⌋ (HyperFlexis §7.1: 8 NPUs per server).
"""

from __future__ import annotations

from dataclasses import dataclass

INTRA_NODE_GBPS = 720.0  # HCCS, HFX paper §4.1
INTER_NODE_GBPS = 200.0  # 200 GbE RoCE, HFX paper §4.1
LINK_LATENCY = 0.5e-3  # seconds per transfer: launch and completion signalling (ours)
DEVICES_PER_NODE = 8  # HyperFlexis §7.1


@dataclass(slots=True)
class Link:
    bandwidth: float  # bytes/s
    latency: float  # seconds
    free_at: float = 0.0  # when the transfer in flight (if any) completes
    transfers: int = 0
    bytes_moved: int = 0


class TLManager:
    def __init__(self, kv_bytes_per_token: int, tp: int = 1,
                 devices_per_node: int = DEVICES_PER_NODE,
                 intra_node_gbps: float = INTRA_NODE_GBPS,
                 inter_node_gbps: float = INTER_NODE_GBPS,
                 latency: float = LINK_LATENCY) -> None:
        if kv_bytes_per_token <= 0:
            raise ValueError("kv_bytes_per_token must be positive")
        if min(tp, devices_per_node) < 1 or min(intra_node_gbps, inter_node_gbps) <= 0:
            raise ValueError("tp, devices_per_node and bandwidths must be positive")
        self.kv_bytes_per_token = kv_bytes_per_token
        self.tp = tp
        self.devices_per_node = devices_per_node
        self.intra_bw = intra_node_gbps * 1e9 / 8
        self.inter_bw = inter_node_gbps * 1e9 / 8
        self.latency = latency
        self.links: dict[tuple[int, int], Link] = {}
        self._prefill: set[int] = set()
        self._decode: set[int] = set()

    def node_of(self, instance_id: int) -> int:
        return instance_id * self.tp // self.devices_per_node

    def _connect(self, p: int, d: int) -> None:
        same = self.node_of(p) == self.node_of(d)
        self.links[(p, d)] = Link(self.intra_bw if same else self.inter_bw, self.latency)

    def add_prefill(self, instance_id: int) -> None:
        """A prefill instance joins: links to every decode instance, before it serves."""
        self._prefill.add(instance_id)
        for d in self._decode:
            self._connect(instance_id, d)

    def add_decode(self, instance_id: int) -> None:
        self._decode.add(instance_id)
        for p in self._prefill:
            self._connect(p, instance_id)

    def remove(self, instance_id: int) -> None:
        self._prefill.discard(instance_id)
        self._decode.discard(instance_id)
        self.links = {k: v for k, v in self.links.items() if instance_id not in k}

    def transfer_time(self, src: int, dst: int, tokens: int) -> float:
        link = self.links[(src, dst)]
        return tokens * self.kv_bytes_per_token / link.bandwidth + link.latency

    def book(self, src: int, dst: int, tokens: int, now: float) -> float:
        """Queue a transfer of ``tokens`` of KV on the link; returns when it completes."""
        try:
            link = self.links[(src, dst)]
        except KeyError:
            raise KeyError(f"no link from prefill instance {src} to decode instance {dst}; "
                           "links are set up when instances join") from None
        start = max(now, link.free_at)
        link.free_at = start + self.transfer_time(src, dst, tokens)
        link.transfers += 1
        link.bytes_moved += tokens * self.kv_bytes_per_token
        return link.free_at
