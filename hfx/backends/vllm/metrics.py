"""What a vLLM server says about itself: its Prometheus ``/metrics`` page read into numbers, and
the served model, limits and KV size an instance checks requests against; and the HTTP client
that HFX talks to vLLM servers with."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hfx.engine import EngineError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What a vLLM server says about itself: served model, limits, KV size."""

    model: str
    max_model_len: int
    kv_total_blocks: int
    block_size: int

    def check(self, request_id: str, prompt_len: int, max_tokens: int) -> None:
        if prompt_len + max_tokens > self.max_model_len:
            raise EngineError(f"{request_id}: {prompt_len} prompt + {max_tokens} output tokens "
                              f"exceed the vLLM server's max_model_len {self.max_model_len}")
        blocks = -(-(prompt_len + max_tokens) // self.block_size)
        if self.kv_total_blocks and blocks > self.kv_total_blocks:
            raise EngineError(f"{request_id}: needs more KV than the vLLM server's "
                              f"{self.kv_total_blocks} blocks of {self.block_size}")

# httpcore's pool can close a connection it has already handed to a request that has not started
# on it (encode/httpcore#1110, open): as a surplus keep-alive connection (more than 20 idle, the
# default), to make room under max_connections, or as expired. The request then breaks, at its
# headers or mid-stream (it did, in CI, under the profiler's 32-request batches). No limits and
# no client-side expiry leave the pool nothing to close; vLLM closes idle connections itself
# (after VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s), which the pool sees before reusing one.
UNLIMITED = httpx.Limits(max_connections=None, max_keepalive_connections=None,
                         keepalive_expiry=None)


# One connection, never kept: the retry's.
FRESH = httpx.Limits(max_connections=1, max_keepalive_connections=0)


def vllm_client(timeout: httpx.Timeout | float) -> httpx.AsyncClient:
    """An HTTP client for vLLM servers whose pool never closes a connection under a request."""
    return httpx.AsyncClient(timeout=timeout, limits=UNLIMITED)


@contextlib.asynccontextmanager
async def vllm_stream(client: httpx.AsyncClient, url: str,
                      **kwargs: Any) -> AsyncIterator[httpx.Response]:
    """``client.stream("POST", url, ...)``, sent once more on a fresh connection if the first
    breaks before any answer: the server closed it, idle, just as the request went out (it never
    saw it), or the server is gone, which the fresh connection's ConnectError then says.

    The second try goes through a client of its own: the pool's other idle connections were
    opened with the broken one (the profiler sends a batch at once) and reach vLLM's keep-alive
    limit together, so one of them could break the same way (it did, in CI)."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            response = await stack.enter_async_context(client.stream("POST", url, **kwargs))
        except (httpx.ReadError, httpx.RemoteProtocolError) as e:
            log.warning("%s had no answer (%s); sending it again on a new connection", url,
                        type(e).__name__)
            fresh = await stack.enter_async_context(
                httpx.AsyncClient(timeout=client.timeout, limits=FRESH))
            response = await stack.enter_async_context(fresh.stream("POST", url, **kwargs))
        yield response


def parse_metrics(text: str) -> dict[str, float]:
    """The vLLM samples of a Prometheus text page (prometheus_client's parser: label values
    may hold commas and quotes), summed over labels; ``cache_config_info``'s numeric labels
    (num_gpu_blocks, block_size) as values."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("vllm:"):
                continue
            if sample.name == "vllm:cache_config_info":
                for key, val in sample.labels.items():
                    with contextlib.suppress(ValueError):
                        out[f"cache_config_info.{key}"] = float(val)
                continue
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def server_info(url: str, timeout: float = 10.0) -> ServerInfo:
    """Ask a running server for its model, max_model_len and KV cache size (blocking: once,
    when the instance joins)."""
    with httpx.Client(timeout=timeout) as client:
        models = client.get(f"{url}/v1/models").raise_for_status().json()["data"]
        metrics = parse_metrics(client.get(f"{url}/metrics").raise_for_status().text)
    return ServerInfo(models[0]["id"], int(models[0].get("max_model_len") or 0),
                      int(metrics.get("cache_config_info.num_gpu_blocks", 0)),
                      int(metrics.get("cache_config_info.block_size", 16)))
