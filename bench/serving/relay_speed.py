"""Relay speed: the CPU cost per relayed token of HFX's data plane, against the floor of a Python
relay, measured side by side in one run.

For each relay kind (``--relays``) and each concurrency (``--streams``), a fresh fake vLLM
server (bench/serving/fake_upstream.py: cheap, precomputed bytes, ``--tokens-per-tick`` tokens every
``--tick-ms`` per stream, each its own SSE event) and a fresh relay in front of it are started,
the relay pinned to core 0, the upstream and the load generator to core 1 (``--no-pin``: not).
Relay kinds:

- ``floor``: bench/serving/relay_floor.py, the least a Python relay does (aiohttp in and out, orjson
  per event, one chunk out per event), on uvloop when installed; ``floor-asyncio``: the same
  on plain asyncio (HFX's gateway runs plain asyncio);
- ``hfx``: ``hfx serve --engine vllm --backend UPSTREAM`` (one instance, rr, no calibration),
  plus ``--hfx-args``; ``--hfx-workers 1,2`` runs it once per value with ``--api-workers V``
  (where ``hfx serve`` has that flag); ``hfx@REF``: the same from a git ref's ``hfx/`` (e.g.
  ``hfx@HEAD``, the last commit, beside the working tree's ``hfx``);
- ``direct``: no relay, the load goes to the upstream (what the upstream and the load
  generator cost by themselves).

N streaming connections (wrk, or an asyncio client where wrk is missing) each POST
``/v1/completions`` (8 prompt ids, ``--max-tokens``, ``ignore_eos``) back to back. After
``--warmup`` seconds, a window of ``--seconds``: CPU time (utime + stime + reaped children's,
from /proc/PID/stat, summed over each process tree) of the relay, the upstream and the load
generator is sampled at both ends, and the tokens relayed inside the window are counted (wrk:
streams that completed in it × max_tokens, each checked to end in ``[DONE]``; the asyncio
client counts the token events themselves). Per token: CPU µs of the relay, of the upstream and
of the load generator (the probe's tokens, below, count for the relay and the upstream). Core
utilisation is reported too: core 1 near 100% means the load side, not the relay, set the
rate, and the figures are not the relay's.

A probe (a thread here, on core 1, raw keep-alive sockets) sends one streamed request at a time
through the relay and then straight to the upstream, alternating, during the window: TTFT,
inter-token gaps, and what the relay adds: to TTFT (p50 through it − p50 direct) and to each
token (per token index, the median delay since the request was sent, through it − direct; the
median over indices).

    python bench/serving/relay_speed.py --json docs/data/relay_speed.json
    python bench/serving/relay_speed.py --relays direct,floor,hfx --streams 32,128 --seconds 8 \\
        --json /tmp/relay_try.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import io
import itertools
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
TAIL_SECONDS = 1.0  # the load runs on this long after the window, so none of it is ramp-down

# wrk: POSTs the body, and counts (per thread, summed in done()) the responses that complete
# inside [t1, t2) on CLOCK_MONOTONIC, which is time.monotonic()'s clock here, and their events.
WRK_LUA = r"""
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local ts = ffi.new("bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

wrk.method = "POST"
wrk.body = BODY
wrk.headers["Content-Type"] = "application/json"

local threads = {}
function setup(thread) table.insert(threads, thread) end

function init(args)
  t1 = tonumber(args[1]); t2 = tonumber(args[2])
  ok = 0; bad = 0; events = 0; empty = 0; total = 0
end

function response(status, headers, body)
  total = total + 1
  local t = now()
  if t < t1 or t >= t2 then return end
  if status == 200 and string.find(body, "data: [DONE]", 1, true) then
    ok = ok + 1
    local _, n = string.gsub(body, "data: {", "")
    local _, e1 = string.gsub(body, '"text": ""', "")
    local _, e2 = string.gsub(body, '"text":""', "")
    events = events + n; empty = empty + e1 + e2
  else
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  local ok, bad, events, empty, total = 0, 0, 0, 0, 0
  for _, t in ipairs(threads) do
    ok = ok + t:get("ok"); bad = bad + t:get("bad"); events = events + t:get("events")
    empty = empty + t:get("empty"); total = total + t:get("total")
  end
  local e = summary.errors
  io.write(string.format(
    "BENCH ok=%d bad=%d events=%d empty=%d total=%d connect=%d read=%d write=%d " ..
    "status=%d timeout=%d\n", ok, bad, events, empty, total, e.connect, e.read, e.write,
    e.status, e.timeout))
end
"""


# ---- processes ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``grace`` seconds."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # and whatever it left in its group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


class Procs:
    """Every subprocess started, each in its own process group; all stopped on exit."""

    def __init__(self, logdir: Path, pin: bool) -> None:
        self.logdir = logdir
        self.pin = pin
        self.live: list[Proc] = []

    def start(self, name: str, cmd: list[str], cores: str | None, **kwargs: Any) -> Proc:
        if self.pin and cores is not None:
            cmd = ["taskset", "-c", cores, *cmd]
        log = self.logdir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     **{"cwd": REPO, **kwargs})
        proc = Proc(name, popen, log)
        self.live.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        proc.stop()
        with contextlib.suppress(ValueError):
            self.live.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(self.live):
            proc.stop(grace=1.0)
        self.live.clear()


def wait_http(proc: Proc, url: str, timeout: float) -> None:
    """Until GET ``url`` answers 200; a clear error with the log's tail if it never does."""
    deadline = time.monotonic() + timeout
    why = ""
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with status {proc.popen.returncode} before "
                               f"{url} answered; its log ({proc.log}):\n{proc.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
                why = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            why = f"HTTP {e.code}"
        except (OSError, urllib.error.URLError) as e:
            why = f"{type(e).__name__}: {e}"
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name}: {url} did not answer 200 in {timeout:.0f} s ({why}); "
                       f"its log ({proc.log}):\n{proc.tail()}")


# ---- CPU time ----------------------------------------------------------------------------------
def _stat(pid: int | str) -> tuple[int, float] | None:
    """(ppid, utime + stime + cutime + cstime in seconds) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rfind(b")") + 2:].split()
    ticks = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    return int(rest[1]), ticks / CLK_TCK


def tree_cpu(roots: list[int]) -> list[float]:
    """CPU seconds of each root's whole process tree (it and all its live descendants; those
    already reaped are in their parent's cutime/cstime)."""
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(name)
            if st is not None:
                stats[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out = []
    for root in roots:
        total, todo = 0.0, [root]
        while todo:
            pid = todo.pop()
            if pid in stats:
                total += stats[pid][1]
            todo.extend(children.get(pid, ()))
        out.append(total)
    return out


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


# ---- the probe ---------------------------------------------------------------------------------
class Dechunk:
    """Incremental HTTP/1.1 chunked-body decoder."""

    def __init__(self) -> None:
        self.raw = b""
        self.need = -1  # -1: a size line next; else payload bytes (+ CRLF) to come
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self.raw += data
        out = []
        while not self.done:
            if self.need < 0:
                i = self.raw.find(b"\r\n")
                if i < 0:
                    break
                self.need = int(self.raw[:i].split(b";")[0], 16)
                self.raw = self.raw[i + 2:]
                if self.need == 0:
                    self.done = True  # (no trailers are sent here; the final CRLF is read below)
                    break
            if len(self.raw) < self.need + 2:
                break
            out.append(self.raw[:self.need])
            self.raw = self.raw[self.need + 2:]
            self.need = -1
        return b"".join(out)


@dataclass
class ProbeRun:
    ttft: list[float] = field(default_factory=list)  # ms
    gaps: list[float] = field(default_factory=list)  # ms between token events
    tpot: list[float] = field(default_factory=list)  # ms, (last - first) / (n - 1) per request
    lags: list[list[float]] = field(default_factory=list)  # ms since sent, per token
    errors: int = 0
    last_error: str = ""


class ProbeClient:
    """One keep-alive raw socket, one streamed request at a time."""

    def __init__(self, port: int, body: bytes) -> None:
        self.port = port
        self.request = (b"POST /v1/completions HTTP/1.1\r\nHost: probe\r\nContent-Type: "
                        b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        self.sock: socket.socket | None = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def one(self, run: ProbeRun, timeout: float = 60.0) -> None:
        try:
            times = self._one(timeout)
        except (OSError, ValueError, RuntimeError) as e:
            self.close()
            run.errors += 1
            run.last_error = f"{type(e).__name__}: {e}"
            return
        if not times:
            run.errors += 1
            run.last_error = "no tokens"
            return
        run.ttft.append(times[0])
        run.gaps.extend(b - a for a, b in itertools.pairwise(times))
        if len(times) > 1:
            run.tpot.append((times[-1] - times[0]) / (len(times) - 1))
        run.lags.append(times)

    def _one(self, timeout: float) -> list[float]:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s = self.sock
        sent = time.perf_counter()
        s.sendall(self.request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = s.recv(65536)
            if not data:
                raise RuntimeError("connection closed before the response's head")
            buf += data
        head, buf = buf.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0]
        if b" 200 " not in status + b" ":
            raise RuntimeError(f"answered {status.decode(errors='replace')}")
        if b"chunked" not in head.lower():
            raise RuntimeError("not a chunked stream")
        dechunk, events, times = Dechunk(), b"", []
        data = buf
        while True:
            now = time.perf_counter()
            events += dechunk.feed(data)
            while True:
                i = events.find(b"\n\n")
                if i < 0:
                    break
                event, events = events[:i], events[i + 2:]
                if event.startswith(b"data: {"):
                    choice = json.loads(event[6:])["choices"][0]
                    if choice.get("text"):
                        times.append((now - sent) * 1e3)
            if dechunk.done:
                break
            data = s.recv(65536)
            if not data:
                raise RuntimeError("connection closed mid-stream")
        while not dechunk.raw.endswith(b"\r\n"):  # the CRLF after the last chunk
            data = s.recv(65536)
            if not data:
                break
            dechunk.raw += data
        return times


def probe(targets: dict[str, int], body: bytes, until: float,
          out: dict[str, ProbeRun]) -> None:
    """Alternate one streamed request through each target until ``until`` (monotonic)."""
    clients = {name: ProbeClient(port, body) for name, port in targets.items()}
    for name in clients:
        out[name] = ProbeRun()
    try:
        while time.monotonic() < until:
            for name, client in clients.items():
                client.one(out[name], timeout=max(5.0, until - time.monotonic() + 30))
    finally:
        for client in clients.values():
            client.close()


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def token_delay_added(relay: ProbeRun, direct: ProbeRun) -> float | None:
    """Per token index, median delay since sent through the relay − direct; their median."""
    n = min([len(x) for x in relay.lags + direct.lags], default=0)
    if n == 0:
        return None
    return statistics.median(
        statistics.median(x[i] for x in relay.lags) - statistics.median(x[i] for x in direct.lags)
        for i in range(n))


# ---- load generators ---------------------------------------------------------------------------
def have_wrk(install: bool) -> bool:
    if shutil.which("wrk"):
        return True
    if not install or os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    print("wrk is missing: apt-get install -y wrk", file=sys.stderr)
    cmd = "apt-get install -y -qq wrk || (apt-get update -qq && apt-get install -y -qq wrk)"
    subprocess.run(["sh", "-c", cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)
    return shutil.which("wrk") is not None


def start_wrk(procs: Procs, workdir: Path, port: int, streams: int, body: bytes, t1: float,
              t2: float, duration: float, cores: str) -> Proc:
    script = workdir / "load.lua"
    script.write_text(f"BODY = {json.dumps(body.decode())}\n{WRK_LUA}")
    cmd = ["wrk", "-t1", f"-c{streams}", f"-d{math.ceil(duration)}s", "--timeout", "120s",
           "-s", str(script), f"http://127.0.0.1:{port}/v1/completions", "--",
           f"{t1:.6f}", f"{t2:.6f}"]
    return procs.start(f"wrk-{port}", cmd, cores)


def wrk_result(proc: Proc, max_tokens: int) -> dict[str, int]:
    line = next((x for x in proc.log.read_text(errors="replace").splitlines()
                 if x.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result (status {proc.popen.returncode}); its "
                           f"output:\n{proc.tail()}")
    r = {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    socket_errors = r["connect"] + r["read"] + r["write"] + r["timeout"]
    return {"requests": r["ok"], "tokens": r["ok"] * max_tokens,
            "token_events": r["events"] - r["empty"], "errors": r["bad"],
            "socket_errors": socket_errors, "responses_all": r["total"]}


class LoadConn(asyncio.Protocol):
    """The asyncio load client's connection: request, count token events, at the end again."""

    TOKEN, EMPTY1, EMPTY2 = b"data: {", b'"text": ""', b'"text":""'
    END = b"\r\n0\r\n\r\n"

    def __init__(self, load: Load) -> None:
        self.load = load
        self.transport: asyncio.Transport | None = None
        self.prev = b""
        self.head = True
        self.events = 0  # token events of the response so far
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is no subclass)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.write(self.load.request)

    def data_received(self, data: bytes) -> None:
        load = self.load
        if self.head:
            self.head = False
            if not data.startswith(b"HTTP/1.1 200"):
                load.count_error()
                assert self.transport is not None
                self.transport.close()
                return
        joined = self.prev + data
        p = len(self.prev)
        n = (joined.count(self.TOKEN, max(0, p - 6)) - joined.count(self.EMPTY1, max(0, p - 9))
             - joined.count(self.EMPTY2, max(0, p - 8)))
        self.events += n
        load.count_tokens(n)
        if joined.endswith(self.END):
            load.count_done(self.events)
            self.prev, self.head, self.events = b"", True, 0
            assert self.transport is not None
            self.transport.write(load.request)
        else:
            self.prev = joined[-16:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


class Load:
    """The asyncio load client (where wrk is missing): N connections, token events counted as
    they arrive, inside [t1, t2)."""

    def __init__(self, port: int, body: bytes, t1: float, t2: float, max_tokens: int) -> None:
        self.port = port
        self.request = (b"POST /v1/completions HTTP/1.1\r\nHost: load\r\nContent-Type: "
                        b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        self.t1, self.t2 = t1, t2
        self.max_tokens = max_tokens
        self.tokens = self.requests = self.errors = self.short = 0

    def inside(self) -> bool:
        return self.t1 <= time.monotonic() < self.t2

    def count_tokens(self, n: int) -> None:
        if n and self.inside():
            self.tokens += n

    def count_done(self, events: int) -> None:
        if self.inside():
            self.requests += 1
            self.short += events != self.max_tokens

    def count_error(self) -> None:
        if self.inside():
            self.errors += 1

    async def conn(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        while time.monotonic() < until:
            try:
                _, proto = await loop.create_connection(lambda: LoadConn(self), "127.0.0.1",
                                                        self.port)
            except OSError:
                self.count_error()
                await asyncio.sleep(0.1)
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(proto.lost), until - time.monotonic())
            if proto.transport is not None:
                proto.transport.abort()

    async def run(self, streams: int, until: float) -> None:
        await asyncio.gather(*(self.conn(until) for _ in range(streams)))


def load_main(argv: list[str]) -> None:
    """``relay_speed.py _load PORT STREAMS T1 T2 UNTIL MAX_TOKENS BODY``: the asyncio client."""
    port, streams = int(argv[0]), int(argv[1])
    t1, t2, until = float(argv[2]), float(argv[3]), float(argv[4])
    load = Load(port, argv[6].encode(), t1, t2, int(argv[5]))
    main = load.run(streams, until)
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
    print(f"BENCH ok={load.requests} tokens={load.tokens} errors={load.errors} "
          f"short={load.short}", flush=True)


def python_load_result(proc: Proc) -> dict[str, int]:
    line = next((x for x in proc.log.read_text(errors="replace").splitlines()
                 if x.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError(f"the load client printed no result (status "
                           f"{proc.popen.returncode}); its output:\n{proc.tail()}")
    r = {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    return {"requests": r["ok"], "tokens": r["tokens"], "token_events": r["tokens"],
            "errors": r["errors"] + r["short"], "socket_errors": 0}


# ---- one measurement ---------------------------------------------------------------------------
@dataclass
class Hfx:
    """One HFX to run: the working tree's (``hfx``) or a git ref's (``hfx@REF``)."""

    label: str
    cli: list[str]  # the command before "serve"
    cwd: Path = REPO
    env: dict[str, str] | None = None
    serve: list[str] = field(default_factory=list)  # "serve" and the flags it has
    help: str = ""
    source: str = ""  # which code: a commit, or the working tree on one


@dataclass
class Relay:
    label: str  # floor, floor-asyncio, hfx, hfx@REF, hfx/w2, direct
    kind: str  # floor, floor-asyncio, hfx, direct
    hfx: Hfx | None = None
    extra: list[str] = field(default_factory=list)  # hfx: flags appended


@dataclass
class Setup:
    args: argparse.Namespace
    procs: Procs
    workdir: Path
    model: str
    checkpoint: Path | None
    wrk: bool


def relay_command(setup: Setup, relay: Relay, up_port: int, port: int) -> tuple[list[str], str]:
    """The relay's command line and its readiness path (cwd and env: ``relay.hfx``)."""
    py = sys.executable
    upstream = f"http://127.0.0.1:{up_port}"
    if relay.kind in ("floor", "floor-asyncio"):
        cmd = [py, str(BENCH / "relay_floor.py"), "--port", str(port), "--upstream", upstream]
        if relay.kind == "floor-asyncio":
            cmd.append("--no-uvloop")
        return cmd, "/health"
    assert relay.hfx is not None and setup.checkpoint is not None
    cmd = [*relay.hfx.cli, *relay.hfx.serve, "--backend", upstream,
           "--checkpoint", str(setup.checkpoint), "--port", str(port), *relay.extra]
    return cmd, "/ready"


def measure(setup: Setup, relay: Relay, streams: int) -> dict[str, Any]:
    args, procs = setup.args, setup.procs
    relay_core, load_core = (args.relay_core, args.load_core)
    up_port = free_port()
    upstream = procs.start(f"upstream-{relay.label.replace('/', '-')}-{streams}", [
        sys.executable, str(BENCH / "fake_upstream.py"), "--port", str(up_port),
        "--model", setup.model, "--tokens-per-tick", str(args.tokens_per_tick),
        "--tick-ms", str(args.tick_ms), "--token-id", str(args.token_id)], load_core)
    relay_proc: Proc | None = None
    load: Proc | None = None
    command: list[str] | None = None
    try:
        wait_http(upstream, f"http://127.0.0.1:{up_port}/health", 20)
        if relay.kind == "direct":
            port = up_port
        else:
            port = free_port()
            command, ready = relay_command(setup, relay, up_port, port)
            where: dict[str, Any] = {}
            if relay.hfx is not None:
                where = {"cwd": relay.hfx.cwd, "env": relay.hfx.env}
            relay_proc = procs.start(f"{relay.label.replace('/', '-')}-{streams}", command,
                                     relay_core, **where)
            wait_http(relay_proc, f"http://127.0.0.1:{port}{ready}", args.start_timeout)
        body = json.dumps({"model": setup.model, "prompt": PROMPT, "max_tokens": args.max_tokens,
                           "stream": True, "ignore_eos": True}).encode()
        # One request through it first: a relay that cannot stream fails here, clearly.
        check = ProbeRun()
        client = ProbeClient(port, body)
        client.one(check, timeout=30)
        client.close()
        if check.errors or len(check.lags[0]) != args.max_tokens:
            got = len(check.lags[0]) if check.lags else 0
            log = relay_proc.tail() if relay_proc is not None else upstream.tail()
            raise RuntimeError(f"{relay.label}: a test request failed ({check.last_error or ''}"
                               f"{got} of {args.max_tokens} tokens); log:\n{log}")

        start = time.monotonic() + 0.3  # the load generator's own start
        t1 = start + args.warmup
        t2 = t1 + args.seconds
        duration = args.warmup + args.seconds + TAIL_SECONDS
        if setup.wrk:
            load = start_wrk(procs, setup.workdir, port, streams, body, t1, t2, duration,
                             load_core)
        else:
            load = procs.start(f"load-{streams}", [
                sys.executable, str(Path(__file__).resolve()), "_load", str(port), str(streams),
                f"{t1:.6f}", f"{t2:.6f}", f"{start + duration:.6f}", str(args.max_tokens),
                body.decode()], load_core)
        pids = [upstream.pid, load.pid] + ([relay_proc.pid] if relay_proc else [])

        time.sleep(max(0.0, t1 - time.monotonic()))
        root0 = _stat(relay_proc.pid) if relay_proc else None
        cpu0, self0, w0 = tree_cpu(pids), self_cpu(), time.monotonic()
        probes: dict[str, ProbeRun] = {}
        targets = {"relay": port, "direct": up_port} if relay_proc else {"direct": up_port}
        probe_body = json.dumps({"model": setup.model, "prompt": PROMPT,
                                 "max_tokens": args.probe_tokens, "stream": True,
                                 "ignore_eos": True}).encode()
        thread = threading.Thread(target=probe, args=(targets, probe_body, t2, probes),
                                  daemon=True)
        thread.start()
        time.sleep(max(0.0, t2 - time.monotonic()))
        cpu1, self1, w1 = tree_cpu(pids), self_cpu(), time.monotonic()
        root1 = _stat(relay_proc.pid) if relay_proc else None
        for p in ([relay_proc] if relay_proc else []) + [upstream]:
            if p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited (status {p.popen.returncode}) during the "
                                   f"load; its log:\n{p.tail()}")
        try:
            load.popen.wait(duration + 30)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(
                f"the load generator did not finish; output:\n{load.tail()}") from e
        thread.join(timeout=60)
        counts = (wrk_result(load, args.max_tokens) if setup.wrk else python_load_result(load))
        if not counts["tokens"]:
            raise RuntimeError(f"no stream completed in the window ({counts}); the load "
                               f"generator's output:\n{load.tail()}")
    finally:
        for p in (load, relay_proc, upstream):
            if p is not None:
                procs.stop(p)

    window = w1 - w0
    up_cpu, load_cpu = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    relay_cpu = cpu1[2] - cpu0[2] if relay_proc else None
    # The relay's root process alone: with --api-workers N, HFX's control process (its fronts
    # are its children), the share that must not become the next single-core ceiling.
    root_cpu = root1[1] - root0[1] if root0 is not None and root1 is not None else None
    probe_cpu = self1 - self0
    tokens = counts["tokens"]
    through = probes.get("relay", probes.get("direct", ProbeRun()))
    direct = probes.get("direct", ProbeRun())
    # The probe's streams cost the relay and the upstream too: their tokens count for them.
    relayed = sum(len(x) for x in probes["relay"].lags) if "relay" in probes else 0
    direct_tokens = sum(len(x) for x in direct.lags)

    def per_token(cpu: float | None, n: int) -> float | None:
        return round(cpu / n * 1e6, 2) if cpu is not None and n else None
    added_ttft = (None if relay_proc is None or not through.ttft or not direct.ttft
                  else pct(through.ttft, 50) - pct(direct.ttft, 50))  # type: ignore[operator]
    added_token = token_delay_added(through, direct) if relay_proc else None

    def r(x: float | None, n: int = 2) -> float | None:
        return None if x is None else round(x, n)

    return {
        "relay": relay.label, "streams": streams, "window_s": round(window, 3),
        "tokens": tokens, "tokens_per_s": round(tokens / window, 1),
        "requests": counts["requests"], "errors": counts["errors"],
        "socket_errors": counts["socket_errors"], "token_events": counts["token_events"],
        "relay_cpu_s": r(relay_cpu, 3), "upstream_cpu_s": round(up_cpu, 3),
        "load_cpu_s": round(load_cpu, 3), "probe_cpu_s": round(probe_cpu, 3),
        "probe_tokens": relayed + direct_tokens,
        "relay_cpu_us_per_token": per_token(relay_cpu, tokens + relayed),
        "relay_root_cpu_us_per_token": per_token(root_cpu, tokens + relayed),
        "upstream_cpu_us_per_token": per_token(up_cpu, tokens + relayed + direct_tokens),
        "load_cpu_us_per_token": per_token(load_cpu, tokens),
        # CPU seconds per second of window of each side (pinned: of its cores; > 1 on several).
        "relay_core_busy": r(relay_cpu / window if relay_cpu is not None else None, 3),
        "load_core_busy": round((up_cpu + load_cpu + probe_cpu) / window, 3),
        "probe": {
            "requests": len(through.ttft), "errors": through.errors + direct.errors,
            "last_error": through.last_error or direct.last_error or None,
            "ttft_p50_ms": r(pct(through.ttft, 50)), "ttft_p99_ms": r(pct(through.ttft, 99)),
            "gap_p50_ms": r(pct(through.gaps, 50)), "gap_p99_ms": r(pct(through.gaps, 99)),
            "tpot_p50_ms": r(pct(through.tpot, 50)),
            "direct_ttft_p50_ms": r(pct(direct.ttft, 50)),
            "direct_ttft_p99_ms": r(pct(direct.ttft, 99)),
            "direct_gap_p50_ms": r(pct(direct.gaps, 50)),
            "direct_tpot_p50_ms": r(pct(direct.tpot, 50)),
            "added_ttft_p50_ms": r(added_ttft), "added_token_delay_p50_ms": r(added_token),
        },
        "relay_command": command,
    }


# ---- the run -----------------------------------------------------------------------------------
def cpu_list(text: str) -> set[int]:
    """A taskset-style list, ``0,2-3``."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run_hfx(hfx: Hfx, argv: list[str], timeout: float = 300) -> str:
    """``hfx ARGV``'s output; a clear error if it fails."""
    try:
        done = subprocess.run([*hfx.cli, *argv], capture_output=True, text=True, cwd=hfx.cwd,
                              env=hfx.env, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"{shlex.join([*hfx.cli, *argv])} failed: {e}") from e
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join([*hfx.cli, *argv])} failed (status {done.returncode}):"
                           f"\n{done.stdout[-1000:]}{done.stderr[-3000:]}")
    return done.stdout


def has_flag(help_text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


def git(*argv: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def git_source() -> str:
    """The working tree's code: HEAD's commit, ``+changes`` where hfx/ differs from it."""
    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--", "hfx") else "")


def hfx_of(kind: str, args: argparse.Namespace, workdir: Path) -> Hfx:
    """``hfx``: the --hfx command (the working tree's); ``hfx@REF``: that git ref's hfx/ package,
    extracted here (``git archive``) and run as ``python -m hfx.cli`` from there."""
    if kind == "hfx":
        cli = shlex.split(args.hfx) if args.hfx else [str(Path(sys.executable).with_name("hfx"))]
        if not Path(cli[0]).exists() and shutil.which(cli[0]) is None:
            raise RuntimeError(f"no hfx command at {cli[0]} (--hfx)")
        hfx = Hfx(kind, cli, source=git_source())
    else:
        ref = kind.split("@", 1)[1]
        folder = workdir / f"src-{re.sub(r'[^A-Za-z0-9._-]', '_', ref)}"
        folder.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, "hfx"],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise RuntimeError(f"git archive {ref} hfx failed: "
                               f"{archive.stderr.decode(errors='replace')}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(folder, filter="data")
        env = {**os.environ, "PYTHONPATH": str(folder)}
        commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
        hfx = Hfx(kind, [sys.executable, "-m", "hfx.cli"], folder, env, source=commit)
    hfx.help = run_hfx(hfx, ["serve", "--help"], timeout=120)
    for flag in ("--backend", "--checkpoint", "--port"):
        if not has_flag(hfx.help, flag):
            raise RuntimeError(f"{kind}: hfx serve has no {flag}: cannot run it as a relay")
    wanted = [("--engine", "vllm"), ("--policy", "rr"), ("--profile", "tiny@cpu"),
              ("--calibrate-every", "0"), ("--max-queued", "100000"),
              ("--served-model-name", args.model)]
    hfx.serve = ["serve"]
    for flag, value in wanted:
        if has_flag(hfx.help, flag):
            hfx.serve += [flag, value]
        else:
            print(f"note: {kind}: hfx serve has no {flag}; left out", file=sys.stderr)
    hfx.serve += shlex.split(args.hfx_args)
    return hfx


def relays_of(args: argparse.Namespace, workdir: Path) -> list[Relay]:
    out: list[Relay] = []
    for kind in [x.strip() for x in args.relays.split(",") if x.strip()]:
        if kind in ("floor", "floor-asyncio", "direct"):
            out.append(Relay(kind, kind))
            continue
        if kind != "hfx" and not kind.startswith("hfx@"):
            raise RuntimeError(f"unknown relay kind {kind!r}: floor, floor-asyncio, direct, "
                               f"hfx, hfx@GITREF")
        hfx = hfx_of(kind, args, workdir)
        workers = ints(args.hfx_workers) if args.hfx_workers else []
        if workers and not has_flag(hfx.help, "--api-workers"):
            print(f"note: {kind}: hfx serve has no --api-workers; --hfx-workers ignored",
                  file=sys.stderr)
            workers = []
        if not workers:
            out.append(Relay(kind, "hfx", hfx))
        for w in workers:
            out.append(Relay(f"{kind}/w{w}", "hfx", hfx, ["--api-workers", str(w)]))
    return out


def make_checkpoint(hfx: Hfx, args: argparse.Namespace, workdir: Path) -> Path:
    """A random-weight checkpoint; its folder's name is the served model's (as it is HFX's
    default where --served-model-name is missing)."""
    ckpt = workdir / args.model
    run_hfx(hfx, ["checkpoint", str(ckpt), "--shape", args.shape])
    return ckpt


def fmt(x: Any, spec: str = "") -> str:
    return "-" if x is None else format(x, spec)


def table(results: list[dict[str, Any]]) -> str:
    head = ("relay", "streams", "tok/s", "relay µs/tok", "up µs/tok", "load µs/tok",
            "relay busy", "load busy", "reqs", "err", "ttft p50/p99 ms", "+ttft p50", "+tok p50",
            "tpot p50")
    rows = [head]
    for x in results:
        p = x["probe"]
        rows.append((
            x["relay"], str(x["streams"]), fmt(x["tokens_per_s"], ".0f"),
            fmt(x["relay_cpu_us_per_token"], ".1f"), fmt(x["upstream_cpu_us_per_token"], ".1f"),
            fmt(x["load_cpu_us_per_token"], ".1f"),
            fmt(x["relay_core_busy"] and x["relay_core_busy"] * 100, ".0f") + "%",
            fmt(x["load_core_busy"] * 100, ".0f") + "%", str(x["requests"]),
            str(x["errors"] + x["socket_errors"]),
            f"{fmt(p['ttft_p50_ms'], '.1f')}/{fmt(p['ttft_p99_ms'], '.1f')}",
            fmt(p["added_ttft_p50_ms"], ".1f"), fmt(p["added_token_delay_p50_ms"], ".1f"),
            fmt(p["tpot_p50_ms"], ".2f")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in rows)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--relays", default="floor,hfx",
                   help="comma-separated: floor, floor-asyncio, hfx (the working tree's), "
                   "hfx@GITREF (that commit's hfx/, e.g. hfx@HEAD), direct")
    p.add_argument("--streams", default="32,128,512", help="concurrent streams, comma-separated")
    p.add_argument("--seconds", type=float, default=15.0, help="measured window per run")
    p.add_argument("--warmup", type=float, default=3.0, help="load before the window")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--probe-tokens", type=int, default=16, help="max_tokens of probe requests")
    p.add_argument("--tokens-per-tick", type=int, default=4)
    p.add_argument("--tick-ms", type=float, default=20.0)
    p.add_argument("--token-id", type=int, default=116,
                   help="the upstream's token id (inside the checkpoint's 257-token vocabulary)")
    p.add_argument("--model", default="bench-mini", help="served model name everywhere")
    p.add_argument("--shape", default="mini", help="hfx checkpoint --shape")
    p.add_argument("--hfx", default=None,
                   help="the hfx command (split like a shell); default: next to this Python")
    p.add_argument("--hfx-args", default="", help="extra flags for hfx serve")
    p.add_argument("--hfx-workers", default="",
                   help="e.g. 1,2: run hfx once per value with --api-workers V")
    p.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto",
                   help="auto: wrk (apt-get installed if missing and root), else asyncio")
    p.add_argument("--no-pin", action="store_true", help="no taskset pinning")
    p.add_argument("--relay-core", default="0",
                   help="the relay's core(s), a taskset list (e.g. 0 or 0,2-3)")
    p.add_argument("--load-core", default="1",
                   help="core(s) of the upstream, the load generator and the probe")
    p.add_argument("--start-timeout", type=float, default=120.0, help="relay start, s")
    p.add_argument("--json", default=str(REPO / "docs" / "data" / "relay_speed.json"))
    p.add_argument("--keep-logs", action="store_true", help="keep the temp dir of logs")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    pin = not args.no_pin
    if pin and (os.cpu_count() or 1) < 2:
        print("note: fewer than 2 cores; not pinning", file=sys.stderr)
        pin = False
    if pin and not shutil.which("taskset"):
        print("note: no taskset; not pinning", file=sys.stderr)
        pin = False
    if pin:
        os.sched_setaffinity(0, cpu_list(args.load_core))  # the probe: on the load side
    use_wrk = args.loadgen != "python" and have_wrk(install=True)
    if args.loadgen == "wrk" and not use_wrk:
        raise RuntimeError("--loadgen wrk, but wrk is missing and could not be installed")
    workdir = Path(tempfile.mkdtemp(prefix="relay-speed-"))
    procs = Procs(workdir, pin)
    results: list[dict[str, Any]] = []
    hfx_commands: dict[str, dict[str, Any]] = {}
    try:
        relays = relays_of(args, workdir)
        hfxs = [r.hfx for r in relays if r.hfx is not None]
        checkpoint = make_checkpoint(hfxs[0], args, workdir) if hfxs else None
        for r in relays:
            if r.hfx is not None:
                hfx_commands[r.label] = {"command": [*r.hfx.cli, *r.hfx.serve, *r.extra],
                                         "code": r.hfx.source}
        setup = Setup(args, procs, workdir, args.model, checkpoint, use_wrk)
        for relay in relays:
            for streams in ints(args.streams):
                print(f"{relay.label} × {streams} streams ...", file=sys.stderr, flush=True)
                try:
                    results.append(measure(setup, relay, streams))
                except RuntimeError as e:
                    print(f"FAILED: {relay.label} × {streams}: {e}", file=sys.stderr)
                    results.append({"relay": relay.label, "streams": streams,
                                    "failed": str(e)[-4000:]})
    finally:
        procs.stop_all()
        if not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs: {workdir}", file=sys.stderr)
    return {
        "what": "CPU per relayed token: HFX's data plane vs a minimal Python relay",
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "cpu": cpu_model(),
                    "python": platform.python_version(),
                    "pinned": pin, "relay_core": args.relay_core if pin else None,
                    "load_core": args.load_core if pin else None},
        "load_generator": "wrk" if use_wrk else "asyncio",
        "config": {"seconds": args.seconds, "warmup": args.warmup, "max_tokens": args.max_tokens,
                   "probe_tokens": args.probe_tokens, "tokens_per_tick": args.tokens_per_tick,
                   "tick_ms": args.tick_ms, "prompt_tokens": len(PROMPT),
                   "hfx": hfx_commands},
        "results": results,
    }


def cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


@contextlib.contextmanager
def signals_exit() -> Iterator[None]:
    """SIGTERM/SIGHUP exit through the finally blocks (which stop every subprocess)."""
    def raise_exit(signum: int, _: Any) -> None:
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, raise_exit) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_load":
        load_main(sys.argv[2:])
        return
    args = parse()
    with signals_exit():
        try:
            out = run(args)
        except RuntimeError as e:
            sys.exit(f"relay_speed: {e}")
    ok = [x for x in out["results"] if "failed" not in x]
    if ok:
        print(table(ok))
        cores = len(cpu_list(args.load_core)) if not args.no_pin else os.cpu_count() or 1
        busy = [x for x in ok if x["load_core_busy"] > 0.9 * cores]
        for x in busy:
            print(f"warning: {x['relay']} × {x['streams']}: the load side's core was "
                  f"{x['load_core_busy']:.0%} busy; the rate may be the load side's, not the "
                  f"relay's", file=sys.stderr)
    for x in out["results"]:
        if "failed" in x:
            print(f"{x['relay']} × {x['streams']}: FAILED (see the JSON)", file=sys.stderr)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
