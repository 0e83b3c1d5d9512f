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


def leave_mid_stream(url: str, body: dict, ended, generated, closed=None,
                     attempts: int = 3) -> list[dict]:
    """A client that leaves a streamed completion at ``url`` after its first event: HFX must
    abort the request (``ended()``: HFX's count of each outcome) and vLLM stop generating
    (``generated()``: its servers' token counter, which must stop short of ``max_tokens``);
    ``closed()``, if given: HFX has closed its streams to vLLM.

    vLLM's API front end can lag its engine by a whole output and then hand it over in one
    chunk (its output collector merges what the stream has not taken yet). The request is then
    finished before the client could leave, or vLLM's engine had generated everything before
    the abort reached it: nothing was left to stop, and the attempt proves nothing either way.
    So it tries again, ``attempts`` times at most; a disconnect HFX does not act on fails every
    attempt. Returns the attempts, the last one the one that showed it."""
    tried: list[dict] = []

    def settled() -> bool:  # vLLM's running gauge goes stale once it idles: the counter decides
        count = generated()
        time.sleep(1.0)
        return generated() == count

    while len(tried) < attempts:
        before, outcomes = generated(), ended()
        with httpx.stream("POST", url, json=body, timeout=60) as r:
            next(line for line in r.iter_lines() if line.startswith("data: {"))
        left_at = time.monotonic()
        count = sum(outcomes.values()) + 1
        wait_for(lambda n=count: sum(ended().values()) == n, 15, "the record to end",
                 lambda: (ended(), tried))
        now = ended()
        attempt = {"outcome": next(o for o in now if now[o] != outcomes.get(o, 0)),
                   "ended_after_s": round(time.monotonic() - left_at, 3)}
        tried.append(attempt)
        if attempt["outcome"] == "finished":
            continue  # handed over whole before the client left (or the disconnect unheard)
        assert attempt["outcome"] == "aborted", tried
        if closed is not None:
            wait_for(closed, 10, "HFX to close its stream to vLLM", lambda: tried)
        wait_for(settled, 30, "vLLM to drop the aborted request", lambda: tried)
        attempt["generated"] = generated() - before
        if attempt["generated"] < body["max_tokens"]:
            return tried
        # vLLM's engine had finished before the abort reached it: nothing was left to stop.
    pytest.fail(f"no attempt caught vLLM generating when the client left: {tried}")
