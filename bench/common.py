"""What several benchmarks share: ``hfx serve`` as a subprocess on a free loopback port, for
those that talk HTTP to it (soak, guidellm, long prompts, vLLM): started, waited on until
``/ready``, stopped with SIGTERM; a stand-in for vLLM's interpreter, for servers HFX starts
itself (the fault mix, the Ray and process tests); and the fidelity statistics of served
against simulated records (mean and p90 per task and metric, and their relative error)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from hfx.backends.vllm.process import free_port
from hfx.request import Outcome, RequestRecord

METRICS = ("ttft", "tpot", "e2e")


@dataclass
class Live:
    url: str
    model: str  # the served model id
    process: subprocess.Popen
    args: list[str]  # hfx serve's arguments, the port excluded


@contextmanager
def hfx_serve(*args: str, start_timeout: float = 60.0) -> Iterator[Live]:
    """``hfx serve ARGS --port P`` until the block ends."""
    port = free_port()
    cmd = [sys.executable, "-m", "hfx.cli", "serve", *args, "--port", str(port)]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        yield Live(url, model, process, list(args))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def stand_in_vllm_python(root: Path, api_server: str, path: list[str]) -> str:
    """An interpreter path for ``hfx serve --vllm-python`` (``VLLMLaunch.python``) under which
    ``python -m vllm.entrypoints.openai.api_server`` runs ``api_server`` (Python source), with
    ``path`` on ``PYTHONPATH``: a stand-in server that HFX starts, health-polls, streams from
    and stops as it does vLLM, with no vLLM installed. Written under ``root``."""
    pkg = root / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (root / "vllm", root / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(api_server)
    python = root / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{":".join([str(root), *path])}" '
                      f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return str(python)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """/metrics parsed: (sample name, sorted labels) → value."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def stats(records: list[RequestRecord]) -> dict:
    out: dict = {}
    groups: dict[str, list[RequestRecord]] = {"all": records}
    for r in records:
        groups.setdefault(r.request.task, []).append(r)
    for name, rs in groups.items():
        done = [r for r in rs if r.outcome is Outcome.FINISHED]
        out[name] = {"finished": len(done)}
        if not done:
            continue  # nothing to average: compare() skips the group
        for m in METRICS:
            xs = np.array([getattr(r, m) for r in done])
            out[name][m] = {"mean": float(xs.mean()), "p90": float(np.percentile(xs, 90))}
    return out


def compare(real: dict, sim: dict) -> dict:
    """Relative error of the simulator's mean and p90, per group and metric."""
    return {g: {m: {k: (sim[g][m][k] - real[g][m][k]) / real[g][m][k] for k in ("mean", "p90")}
                for m in METRICS} for g in real
            if isinstance(real[g], dict) and METRICS[0] in real[g] and METRICS[0] in sim[g]}
