"""What the ``vllm`` tier's modules share: where vLLM is, how to read a server's metrics.
Importing it skips the importing module when the serving extras or vLLM are missing."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

for _extra in ("torch", "fastapi", "openai", "httpx"):
    pytest.importorskip(_extra)

import httpx  # noqa: E402

from hfx.backends.vllm.metrics import parse_metrics  # noqa: E402

ARGS = "--enforce-eager --dtype float32"  # float32: greedy output comparable with torch's


def vllm_python() -> str | None:
    """``HFX_VLLM_PYTHON`` (vLLM in its own environment: its pins are not ours), else this
    interpreter if it has vLLM."""
    path = os.environ.get("HFX_VLLM_PYTHON")
    if path:
        return path if Path(path).exists() else None
    return sys.executable if importlib.util.find_spec("vllm") else None


PYTHON = vllm_python()
if PYTHON is None:
    pytest.skip("no vLLM: set HFX_VLLM_PYTHON to an interpreter that has it",
                allow_module_level=True)


def vllm_metrics(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)


def wait_for(cond, seconds: float, what: str, state=None) -> None:
    """Until ``cond()``; on time-out, fail with ``state()`` (what was seen instead)."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            seen = f": {state()}" if state is not None else ""
            raise AssertionError(f"timed out waiting for {what}{seen}")
        time.sleep(0.1)
