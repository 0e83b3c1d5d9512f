"""What an OpenAI-compatible server can do, asked once when it joins the fleet.

Servers that speak OpenAI's API differ in what they add to it: vLLM streams the sampled token
ids (``return_token_ids``) and serves Prometheus metrics with its KV use; SGLang and llama.cpp
take token-id prompts but stream text; ``hfx serve`` streams token ids and takes an SLO per
request. HFX needs token-id prompts (it tokenized each prompt once, and a retry continues from
the tokens so far); the rest it uses where present and does without otherwise, said at start
(``Traits.lacks``).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import orjson

from hfx.backends.vllm.metrics import parse_metrics

PROBE_TIMEOUT = httpx.Timeout(60.0, connect=5.0)  # a cold server's first request compiles


class ProbeError(ValueError):
    """The server cannot serve as an instance; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Traits:
    """One server, as the probe found it."""

    url: str
    model: str
    owner: str  # /v1/models' ``owned_by``: "hfx" for another hfx serve
    max_model_len: int | None  # None: not served (the checkpoint's is used)
    health_path: str  # "/health", or "/v1/models" where there is no /health
    token_ids: bool  # streams the sampled token ids with ``return_token_ids``
    kv_blocks: int | None  # vLLM's metrics: KV blocks and their size; None: not served
    block_size: int | None

    @property
    def takes_slo(self) -> bool:
        """Another hfx serve: each request's SLO (the TTFT left, its TPOT) goes with it."""
        return self.owner == "hfx"

    def lacks(self) -> list[str]:
        """What this server does not give HFX, and what HFX does instead."""
        out = []
        if not self.token_ids:
            out.append("no token ids in its stream: each event's text is tokenized here "
                       "(the text is exact, token counts as close as the tokenizer's round "
                       "trip)")
        if not self.takes_slo:
            out.append("no SLO or priority scheduling: HFX's queue orders requests, the "
                       "server runs what it is sent in its own order")
        out.append("no KV events: the prefix index estimates what HFX routed there")
        if self.kv_blocks is None:
            out.append("no engine metrics: load and KV use come from HFX's own accounting, "
                       "against --kv-capacity-tokens")
        if self.health_path != "/health":
            out.append(f"no /health: health is {self.health_path} answering")
        out.append("abort is closing the connection: whether it stops generating is the "
                   "server's")
        return out


def probe(url: str, prompt: list[int]) -> Traits:
    """Ask the server at ``url``: its model, limits and health path, then one streamed
    completion of ``prompt`` (token ids) for two tokens. Blocks; raises ``ProbeError``."""
    url = url.rstrip("/")
    with httpx.Client(timeout=PROBE_TIMEOUT) as client:
        try:
            models = client.get(f"{url}/v1/models")
        except httpx.HTTPError as e:
            raise ProbeError(f"{url}: no answer to GET /v1/models ({type(e).__name__}: {e})"
                             ) from None
        if models.status_code != 200:
            raise ProbeError(f"{url}: GET /v1/models answered {models.status_code}; an "
                             "OpenAI-compatible server lists its model there")
        try:
            entry = models.json()["data"][0]
            model, owner = str(entry["id"]), str(entry.get("owned_by", ""))
        except (ValueError, KeyError, IndexError, TypeError):
            raise ProbeError(f"{url}: GET /v1/models gave no model: {models.text[:200]!r}"
                             ) from None
        max_len = entry.get("max_model_len")
        health = "/health" if _get(client, f"{url}/health") is not None else "/v1/models"
        kv_blocks = block_size = None
        metrics = _get(client, f"{url}/metrics")
        if metrics is not None and "vllm:" in metrics:
            m = parse_metrics(metrics)
            if m.get("cache_config_info.num_gpu_blocks"):
                kv_blocks = int(m["cache_config_info.num_gpu_blocks"])
                block_size = int(m.get("cache_config_info.block_size", 16))
        token_ids = _streams_token_ids(client, url, model, prompt)
    return Traits(url, model, owner, int(max_len) if isinstance(max_len, int) else None,
                  health, token_ids, kv_blocks, block_size)


def _get(client: httpx.Client, url: str) -> str | None:
    """The page's text if it answers 200, else None."""
    try:
        r = client.get(url)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


def _streams_token_ids(client: httpx.Client, url: str, model: str, prompt: list[int]) -> bool:
    """One streamed completion of a token-id prompt: whether its events carry token ids."""
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "stream": True,
            "return_token_ids": True, "temperature": 0.0}
    try:
        with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                detail = r.read().decode(errors="replace")[:300]
                raise ProbeError(
                    f"{url}: a streamed completion of a token-id prompt was answered "
                    f"{r.status_code}: {detail}. HFX sends each prompt as token ids (OpenAI's "
                    "prompt as a list of integers), which this server must take")
            ids = False
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = orjson.loads(line[6:])
                choices = chunk.get("choices") or [{}]
                ids = ids or isinstance(choices[0].get("token_ids"), list)
            return ids
    except httpx.HTTPError as e:
        raise ProbeError(f"{url}: the probe's completion failed ({type(e).__name__}: {e})"
                         ) from None
    except orjson.JSONDecodeError as e:
        raise ProbeError(f"{url}: the probe's completion streamed an event that is not JSON "
                         f"({e})") from None
