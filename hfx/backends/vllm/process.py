"""vLLM OpenAI servers as child processes of ``hfx serve --engine vllm``.

In-process ``AsyncLLM`` still spawns its engine processes and saves no start-up, so HTTP to a
server process is the integration surface: each instance is ``python -m
vllm.entrypoints.openai.api_server`` on its own port, started with priority scheduling (HFX's
urgency reaches vLLM's scheduler), the KV size HFX was given, and its own CPU cores or GPU.
``VLLMPlacement`` starts the fleet (or attaches to servers someone else runs, ``--backend``) and
the Scaler's new instances.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx

import hfx
from hfx.backends.openai_stream import DEFAULT_IDLE_TIMEOUT, Relay
from hfx.backends.vllm.instance import VLLMInstance
from hfx.backends.vllm.metrics import server_info
from hfx.cluster.provisioner import Plan
from hfx.engine import EngineConfig, Role

if TYPE_CHECKING:
    from hfx.config import VLLMSection

log = logging.getLogger(__name__)

HEALTH_POLL_SECONDS = 0.5
# A server that exits during the fleet's start is started again this many times (on new ports)
# before ``hfx serve`` gives up: one of several vLLM processes started together on a loaded
# machine was seen to fail its engine core's start once, and the next start succeed.
START_RETRIES = 1
STOP_GRACE_SECONDS = 10.0
LOG_TAIL_CHARS = 3000
ROOT_CAUSE_CHARS = 3000
PR_SET_PDEATHSIG = 1  # linux/prctl.h
HFX_SCHEDULER = "hfx.backends.vllm.scheduler.HFXScheduler"


class ServerStartError(RuntimeError):
    """A server did not come up: it exited during start-up (``exited``), or it was not ready
    in time."""

    def __init__(self, message: str, exited: bool) -> None:
        super().__init__(message)
        self.exited = exited


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def failure_excerpt(log: str) -> str:
    """What a failed start shows of a server's log: its first traceback, where the root
    cause is (vLLM's engine core fails first and the API server's own traceback follows),
    and the tail."""
    tail = log[-LOG_TAIL_CHARS:]
    first = log.find("Traceback (most recent call last)")
    if first < 0 or first >= len(log) - LOG_TAIL_CHARS:
        return tail
    return f"{log[first:first + ROOT_CAUSE_CHARS]}\n[...]\n{tail}"


def block_size_for(block_size: int, device: str) -> int:
    """vLLM's CPU attention takes blocks of a multiple of 32 tokens: round up there."""
    return -(-block_size // 32) * 32 if device == "cpu" else block_size


def example_connector(storage: str) -> str:
    """vLLM's ExampleConnector over a shared directory: the prefill's KV saved as files that
    the decode side loads (CPU and GPU alike, a filesystem both servers see; a debugging
    connector whose files stay: NixlConnector or LMCache for production, by
    --vllm-kv-transfer-config)."""
    return json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": {"shared_storage_path": storage}})


def cpu_binding(index: int, count: int, cores: list[int]) -> str:
    """Instance ``index`` of ``count``: its share of the cores, as VLLM_CPU_OMP_THREADS_BIND
    reads it ("0-3" or "5"); shared round-robin when there are fewer cores than instances
    (vLLM's default binds every server to the same first cores)."""
    cores = sorted(cores)
    if count >= len(cores):
        return str(cores[index % len(cores)])
    per = len(cores) // count
    mine = cores[index * per:(index + 1) * per]
    return f"{mine[0]}-{mine[-1]}" if len(mine) > 1 else str(mine[0])


@dataclass(frozen=True, slots=True)
class VLLMLaunch:
    """How HFX starts each vLLM server. P/D needs a KV connector (``extra_args``'
    ``--kv-transfer-config``, the same on every server: each may be either role)."""

    python: str  # an interpreter with vLLM installed (vLLM may live in its own environment)
    model: str  # a Hugging Face checkpoint directory
    served_name: str
    max_model_len: int
    max_num_seqs: int
    kv_capacity_tokens: int
    block_size: int
    device: str = "cpu"
    extra_args: tuple[str, ...] = ()
    startup_timeout: float = 600.0
    kv_events: bool = True  # publish KV cache events for HFX's prefix index (issue 47)
    # HFX's scheduler inside the server (scheduler.py), or vLLM's own ("stock").
    scheduler: str = "hfx"
    host: str = "127.0.0.1"
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="hfx-vllm-")))

    @classmethod
    def of(cls, config: VLLMSection, model: str, served_name: str, max_model_len: int,
           max_num_seqs: int, kv_capacity_tokens: int, block_size: int, device: str | None,
           extra_args: tuple[str, ...] = ()) -> VLLMLaunch:
        """The launch ``hfx serve`` and ``hfx profile`` make from their vLLM options:
        ``--vllm-python`` (default: this interpreter), ``--vllm-args`` then ``extra_args``,
        the block size vLLM's attention takes on ``device`` (default cpu)."""
        device = device or "cpu"
        return cls(python=config.vllm_python or sys.executable, model=model,
                   served_name=served_name, max_model_len=max_model_len,
                   max_num_seqs=max_num_seqs, kv_capacity_tokens=kv_capacity_tokens,
                   block_size=block_size_for(block_size, device), device=device,
                   extra_args=(*shlex.split(config.vllm_args), *extra_args),
                   startup_timeout=config.vllm_startup_timeout,
                   kv_events=config.vllm_kv_events, scheduler=config.vllm_scheduler)

    @property
    def scheduler_profile(self) -> Path:
        """Where HFX's scheduler in each server reads the step-time profile: ``hfx serve``
        writes it once the servers are measured (or from --profile); until then they
        schedule as stock vLLM."""
        return self.log_dir / "profile.json"

    def _scheduler_args(self) -> list[str]:
        if self.scheduler != "hfx":
            return []
        return ["--scheduler-cls", HFX_SCHEDULER,
                "--additional-config", json.dumps({"hfx": {"profile":
                                                           str(self.scheduler_profile)}})]

    def _scheduler_path(self) -> str:
        """A folder that holds the ``hfx`` package alone (a link to it), for vLLM's
        interpreter to import the scheduler from: HFX's own environment, whose pins are not
        vLLM's, stays off that interpreter's path."""
        folder = self.log_dir / "pythonpath"
        link = folder / "hfx"
        if not link.exists():
            folder.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # another server linked it meanwhile
                link.symlink_to(Path(hfx.__file__).resolve().parent, target_is_directory=True)
        return str(folder)

    def command(self, port: int, events_port: int | None = None) -> list[str]:
        # Prefix caching stays on (vLLM's default); with ``events_port`` the server publishes
        # its KV events there (vllm/distributed/kv_events.py: ZmqEventPublisher binds it).
        events = [] if events_port is None else [
            "--kv-events-config", json.dumps({"enable_kv_cache_events": True,
                                              "publisher": "zmq",
                                              "endpoint": f"tcp://*:{events_port}"})]
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--served-model-name", self.served_name,
            "--host", self.host, "--port", str(port),
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--block-size", str(self.block_size),
            "--num-gpu-blocks-override", str(max(1, self.kv_capacity_tokens // self.block_size)),
            "--scheduling-policy", "priority",
            "--disable-uvicorn-access-log",
            *events,
            *self._scheduler_args(),
            *self.extra_args,
        ]

    def env(self, index: int, count: int) -> dict[str, str]:
        env = dict(os.environ)
        if self.scheduler == "hfx":
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (self._scheduler_path(), env.get("PYTHONPATH")) if p)
        if self.device == "cpu":
            # The KV size is set in blocks above; vLLM on CPU also wants room for it (GiB).
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(index, count,
                                                           sorted(os.sched_getaffinity(0)))
        else:
            env["CUDA_VISIBLE_DEVICES"] = str(index)
        return env


class ServerProcess(Protocol):
    """A vLLM server HFX started and stops: ``VLLMServer`` here, or ``RayVLLMServer`` under a
    Ray actor (hfx/backends/vllm/ray_actor.py)."""

    url: str

    def start(self) -> ServerProcess: ...

    def wait_ready_blocking(self) -> None: ...

    async def wait_ready(self) -> None: ...

    def alive(self) -> bool: ...

    def kill(self) -> None: ...

    async def stop(self) -> None: ...


ServerFactory = Callable[["VLLMLaunch", int, int], ServerProcess]


class VLLMServer:
    """One vLLM server process: start, wait until it serves, stop."""

    def __init__(self, launch: VLLMLaunch, index: int, count: int,
                 env: dict[str, str] | None = None) -> None:
        self.launch = launch
        self._env = env or {}  # over the launch's (a Ray actor's GPU)
        self.index = index
        self.port = free_port(launch.host)
        self.url = f"http://{launch.host}:{self.port}"
        # Where its KV events are published, if they are.
        self.events_port = free_port(launch.host) if launch.kv_events else None
        self.kv_events = (None if self.events_port is None
                          else f"tcp://{launch.host}:{self.events_port}")
        self.log_path = launch.log_dir / f"vllm-{index}-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._count = count

    def start(self) -> VLLMServer:
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self.launch.command(self.port, self.events_port),
                env={**self.launch.env(self.index, self._count), **self._env},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        _RUNNING.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return failure_excerpt(self.log_path.read_text(errors="replace"))
        return ""

    def _not_started(self, why: str, exited: bool = False) -> ServerStartError:
        return ServerStartError(f"vLLM server {self.index} on port {self.port} {why}; log "
                                f"{self.log_path}:\n{self.log_tail()}", exited)

    async def wait_ready(self) -> None:
        """Until /health answers 200; raises with the log's tail if the process exits or the
        start-up timeout passes. The loop serves meanwhile."""
        deadline = time.monotonic() + self.launch.startup_timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if not self.alive():
                    raise self._not_started("exited during start-up", exited=True)
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise self._not_started(f"not ready in {self.launch.startup_timeout:g} s")
                await asyncio.sleep(HEALTH_POLL_SECONDS)

    def wait_ready_blocking(self) -> None:
        """``wait_ready`` for code not on a loop yet (the fleet at start)."""
        deadline = time.monotonic() + self.launch.startup_timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                if not self.alive():
                    raise self._not_started("exited during start-up", exited=True)
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise self._not_started(f"not ready in {self.launch.startup_timeout:g} s")
                time.sleep(HEALTH_POLL_SECONDS)

    def kill(self) -> None:
        """Stop the process group: SIGTERM, then SIGKILL to whatever is left after the grace
        period. The group, not the pid: vLLM's engine processes outlive an API server that was
        killed, and only the group still names them."""
        _RUNNING.discard(self)
        proc = self._proc
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_GRACE_SECONDS)
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()

    async def stop(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.kill)


_RUNNING: set[VLLMServer] = set()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when HFX dies, even by SIGKILL, which no
    atexit handler sees."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@atexit.register
def _kill_children() -> None:
    """No vLLM server outlives the HFX process that started it."""
    for server in list(_RUNNING):
        server.kill()


class VLLMPlacement:
    """Every instance a vLLM server: the ``backends`` given (servers someone else runs) first,
    then servers started here from ``launch``; and a warm pool for the Scaler.

    The warm pool (HyperFlexis §6: runtimes up, no request on them) is ``warm_pool`` servers
    started with the fleet and kept idle. A scale-out takes one, which is ready at once; a
    released server goes back to the pool while it has room (its runtime stays up, as the
    seed's device does), else it is stopped. Without a warm server a scale-out is a cold start:
    the process starts and loads the weights itself. (vLLM's sleep mode, which would also give
    an idle server's memory back, is GPU-only.)
    """

    def __init__(self, launch: VLLMLaunch | None, backends: tuple[str, ...] = (),
                 max_num_seqs: int = 256, warm_pool: int = 0,
                 new_server: ServerFactory = VLLMServer,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        if launch is None and not backends:
            raise ValueError("a vLLM fleet needs a checkpoint to start servers from, or "
                             "--backend URLs of running ones")
        if warm_pool and launch is None:
            raise ValueError("a warm pool of vLLM servers needs --checkpoint to start them")
        self.spec = launch
        self.backends = [b.rstrip("/") for b in backends]
        self.max_num_seqs = launch.max_num_seqs if launch is not None else max_num_seqs
        self.warm_pool = warm_pool
        self.new_server = new_server  # a child process here, or under a Ray actor
        self.idle_timeout = idle_timeout  # each instance's bound on a silent stream
        self.attached: dict[str, Role] = {}  # backend URL → the role it serves in
        self.relay: Relay | None = None  # where streams run: the front processes, if any
        self.warm: list[ServerProcess] = []  # started, healthy, serving nothing
        self._prepared: list[VLLMInstance] = []

    def initial(self, configs: list[tuple[int, EngineConfig]]) -> list[VLLMInstance]:
        """The fleet at start: the one ``prepare`` made, else made now; blocks."""
        members = [(iid, cfg.role) for iid, cfg in configs]
        if [(i.id, i.role) for i in self._prepared] == members:
            return self._prepared
        return self.prepare(members)

    def prepare(self, members: list[tuple[int, Role]]) -> list[VLLMInstance]:
        """Attach to the backends, start servers for the rest and the warm pool (in
        parallel), each instance in its role; blocks. Called before the cluster exists when
        the servers must be measured first (the profile)."""
        role = dict(members)
        ids = [iid for iid, _ in members]
        attached = list(zip(ids, self.backends, strict=False))
        self.attached = {url: role[iid] for iid, url in attached}
        to_start = ids[len(attached):]
        if to_start and self.spec is None:
            raise ValueError(f"{len(ids)} instances asked for and {len(self.backends)} "
                             "--backend URLs given; give a checkpoint to start the rest")
        spec = self.spec
        count = len(to_start) + self.warm_pool
        servers = [self.new_server(spec, i, count).start()  # type: ignore[arg-type]
                   for i in range(count)]
        try:
            for k in range(count):
                servers[k] = self._ready(servers[k], k, count)
            fleet = [self._instance(iid, url, None, role[iid]) for iid, url in attached]
            fleet += [self._instance(iid, s.url, s, role[iid])
                      for iid, s in zip(to_start, servers, strict=False)]
        except BaseException:  # all or nothing: no server left for a fleet that did not start
            for s in servers:
                s.kill()
            raise
        self.warm = servers[len(to_start):]
        self._prepared = fleet
        return fleet

    def _ready(self, server: ServerProcess, index: int, count: int) -> ServerProcess:
        """``server`` once ready; one that exits during start-up is started again, up to
        ``START_RETRIES`` times (the last failure is raised)."""
        for attempt in range(START_RETRIES + 1):
            try:
                server.wait_ready_blocking()
                return server
            except ServerStartError as e:
                if not e.exited or attempt == START_RETRIES:
                    raise
                log.warning("%s\nstarting it again", e)
                server.kill()
                server = self.new_server(self.spec, index, count).start()  # type: ignore[arg-type]
        raise AssertionError("unreachable")

    def _instance(self, iid: int, url: str, server: ServerProcess | None,
                  role: Role) -> VLLMInstance:
        instance = VLLMInstance(iid, url, server_info(url), self.max_num_seqs, server,
                                role=role, idle_timeout=self.idle_timeout, relay=self.relay,
                                kv_events=getattr(server, "kv_events", None))
        if server is not None:
            instance.on_stop = self._retire
        return instance

    def health_path(self, url: str) -> str:
        """Where the server at ``url`` answers 200 while it can serve."""
        return "/health"

    def attach(self, iid: int, url: str, role: Role) -> VLLMInstance:
        """An instance on a running server someone else owns (``--backend``); blocks."""
        return self._instance(iid, url, None, role)

    def describe_launch(self, plan: Plan) -> str:
        """What ``launch`` will do now: vLLM servers load their own weights, so the
        provisioner's weight path and modelled seconds do not apply."""
        if self.warm:
            return f"a warm vLLM server ({len(self.warm)} in the pool)"
        return "a cold vLLM server: a process start and its own weight load"

    async def launch(self, instance_id: int, config: EngineConfig, plan: Plan) -> VLLMInstance:
        """A server for the Scaler: a warm one if the pool has one, else a cold start."""
        loop = asyncio.get_running_loop()
        if self.warm:
            server = self.warm.pop(0)
        elif self.spec is None:
            raise RuntimeError("cannot start a vLLM server without --checkpoint")
        else:
            server = self.new_server(self.spec, instance_id, max(2, instance_id + 1)).start()
        try:
            await server.wait_ready()
            return await loop.run_in_executor(None, self._instance, instance_id, server.url,
                                              server, config.role)
        except BaseException:
            await server.stop()
            raise

    async def _retire(self, server: ServerProcess) -> None:
        """A released instance's server: back to the warm pool while it has room."""
        if server.alive() and len(self.warm) < self.warm_pool:
            self.warm.append(server)
        else:
            await server.stop()

    async def close(self) -> None:
        """Stop the warm pool's servers (the fleet's stop with their instances)."""
        warm, self.warm = self.warm, []
        for server in warm:
            await server.stop()
