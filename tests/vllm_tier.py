"""What the ``vllm`` tier's modules share: where vLLM is, how to read a server's metrics."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from hfx.cluster.vllm_instance import parse_metrics

ARGS = "--enforce-eager --dtype float32"  # float32: greedy output comparable with torch's


def vllm_python() -> str | None:
    """``HFX_VLLM_PYTHON`` (vLLM in its own environment: its pins are not ours), else this
    interpreter if it has vLLM."""
    path = os.environ.get("HFX_VLLM_PYTHON")
    if path:
        return path if Path(path).exists() else None
    return sys.executable if importlib.util.find_spec("vllm") else None


PYTHON = vllm_python()


def skip_without_vllm() -> None:
    if PYTHON is None:
        pytest.skip("no vLLM: set HFX_VLLM_PYTHON to an interpreter that has it",
                    allow_module_level=True)


def vllm_metrics(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)


def wait_for(cond, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
