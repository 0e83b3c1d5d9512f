"""An OpenAI-compatible server as an instance: vLLM's instance (streams, faults, ejection,
health, resumption) with the request body and the stats of a server that may have none of
vLLM's extras (``probe.Traits`` says which it has)."""

from __future__ import annotations

import dataclasses
from typing import Any

from hfx.backends.openai.probe import Traits, probe
from hfx.backends.openai_stream import LocalRelay, Relay, TextIds
from hfx.backends.vllm.instance import VLLMInstance
from hfx.backends.vllm.metrics import ServerInfo
from hfx.backends.vllm.process import VLLMPlacement
from hfx.engine import EngineError, InstanceStats, Role
from hfx.request import Request

MIN_TTFT_MS = 1.0  # an SLO's TTFT already spent is sent as this (hfx serve takes only > 0)


class OpenAIInstance(VLLMInstance):
    """One OpenAI-compatible server, as its ``Traits`` say it is."""

    def __init__(self, instance_id: int, traits: Traits, info: ServerInfo, max_num_seqs: int,
                 idle_timeout: float, relay: Relay) -> None:
        super().__init__(instance_id, traits.url, info, max_num_seqs, idle_timeout=idle_timeout,
                         relay=relay)
        self.traits = traits
        self.health_path = traits.health_path
        self.metrics_path = "/metrics" if traits.kv_blocks is not None else None

    def body(self, request: Request, best_effort: bool, now: float) -> dict[str, Any]:
        """The OpenAI fields every such server takes, and the extensions this one has."""
        sampling = request.sampling
        body: dict[str, Any] = {
            "model": self.info.model, "prompt": request.prompt_token_ids,
            "max_tokens": request.max_tokens, "stream": True,
            "temperature": sampling.temperature, "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if not request.stop_token_ids:  # the client asked to ignore the end token
            body["ignore_eos"] = True  # vLLM's, SGLang's, llama.cpp's and hfx's name
        if self.traits.token_ids:
            body["return_token_ids"] = True
        slo = request.slo
        if self.traits.takes_slo and slo is not None and not best_effort:
            left = (request.arrival + slo.ttft - now) * 1e3
            body["slo"] = {"ttft_ms": max(MIN_TTFT_MS, left), "tpot_ms": slo.tpot * 1e3}
        return body

    def _snapshot(self, m: dict[str, float]) -> InstanceStats:
        stats = super()._snapshot(m)
        if self.metrics_path is not None:
            return stats
        # No engine metrics: the KV its requests hold, by HFX's own count of their tokens.
        size = self.info.block_size
        held = sum(-(-(s.request.prompt_len + s.tokens) // size) for s in self._sent.values())
        return dataclasses.replace(stats, kv_used_blocks=min(held, self.info.kv_total_blocks))


class OpenAIPlacement(VLLMPlacement):
    """The ``--backend`` servers, each probed as it joins (at start, and when the healer
    re-admits it: a restarted server may be another)."""

    def __init__(self, backends: tuple[str, ...], max_num_seqs: int, idle_timeout: float,
                 text_ids: TextIds, probe_prompt: list[int], kv_tokens: int, block_size: int,
                 max_model_len: int) -> None:
        super().__init__(None, backends, max_num_seqs, idle_timeout=idle_timeout)
        self.text_ids = text_ids
        self.probe_prompt = probe_prompt
        self.kv_tokens, self.block_size = kv_tokens, block_size  # when a server has no metrics
        self.max_model_len = max_model_len
        self.traits: dict[str, Traits] = {}  # url → as last probed

    def health_path(self, url: str) -> str:
        traits = self.traits.get(url)
        return traits.health_path if traits is not None else "/health"

    def _instance(self, iid: int, url: str, server: Any, role: Role) -> OpenAIInstance:
        if role is not Role.COLOCATED:
            raise EngineError("--engine openai serves colocated: P/D needs a KV connector "
                              "between the servers (--engine vllm)")
        traits = self.traits[url] = probe(url, self.probe_prompt)
        if traits.kv_blocks is not None and traits.block_size is not None:
            blocks, size = traits.kv_blocks, traits.block_size
        else:
            blocks, size = self.kv_tokens // self.block_size, self.block_size
        max_len = min(self.max_model_len, traits.max_model_len or self.max_model_len)
        info = ServerInfo(traits.model, max_len, blocks, size)
        relay = self.relay or LocalRelay(self.idle_timeout, self.text_ids)
        return OpenAIInstance(iid, traits, info, self.max_num_seqs, self.idle_timeout, relay)
