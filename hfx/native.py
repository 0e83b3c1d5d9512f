"""The simulator's hot modules compiled by mypyc, opt in: ``hfx native build``, then
``HFX_NATIVE=1`` for any ``hfx`` command or script (``0`` or unset: Python).

The same source, compiled: one engine, not two (issue 31). A build is made for exactly the
source tree it came from: its key hashes every ``.py`` file of the package, and a process whose
source differs from the build's (an edit since) runs as plain Python and says so on stderr,
rather than run stale code. Builds live outside the tree (``cache_root()/<key>``); nothing in
the source tree changes. The processes of a run may differ (a front process, a Ray actor on a
node without the build): what travels between them pickles through its constructor
(``__reduce__``), one format compiled and as Python.

Compiled: the engine core and its planners, requests and records, the ledger, the control plane,
the fleet and the local instance driver, the step-time model and its noise, the virtual loop's
timers and iteration, a run's arrivals and its request stream's rows, what a policy sees and
decides, SCORPIO's deadline queue, the per-step and per-request path of a simulated run, and
every policy with its queues and shadows. ``Policy`` and ``ArrivalOrderPolicy`` let Python
classes derive from them (tests' policies), at the cost of a lookup per method call. A compiled
policy's parameters pass by keyword, never forwarded as ``**params`` through
``super().__init__`` (compiled, that handed the dict itself to the first parameter). Not
compiled: SA's annealing kernel (numba compiles it), the executors (tests subclass them), the
request stream's ``Sequence`` (an ABC), the virtual loop's class (it derives from asyncio's
Python classes). A compiled dataclass writes its ``__init__`` out where it is made per request
or per step: the one dataclasses generates is Python (tests/test_native.py checks the hot ones).
Results are bit-identical to plain Python (the golden runs, in CI); speed: docs/performance.md,
"Compiled". Each module of ``MODULES`` says so in its first line (``MARK``; checked by
tests/test_native_marks.py), so that whoever edits one knows these rules hold there.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

PACKAGE = Path(__file__).resolve().parent
MODULES = (
    "hfx/engine/block_manager.py", "hfx/engine/prefix_cache.py", "hfx/engine/cohort.py",
    "hfx/engine/core.py",
    "hfx/engine/decode_run.py", "hfx/engine/sequence.py", "hfx/engine/stats.py",
    "hfx/engine/tick_calendar.py", "hfx/engine/waiting.py", "hfx/request.py",
    "hfx/engine/planners/base.py", "hfx/engine/planners/chunked.py",
    "hfx/engine/planners/credit.py", "hfx/engine/planners/deadline_chunked.py",
    "hfx/engine/planners/prefill_first.py", "hfx/engine/planners/slo_paced.py",
    "hfx/engine/planners/tpot_chunked.py", "hfx/engine/planners/vllm.py",
    "hfx/engine/planners/pacing.py",
    "hfx/cluster/ledger.py", "hfx/cluster/control.py",
    "hfx/cluster/fleet.py", "hfx/cluster/stage.py", "hfx/backends/local.py",
    "hfx/records/columns.py", "hfx/stepmodel/step_time.py", "hfx/engine/step_noise.py",
    "hfx/engine/admission.py", "hfx/sim/timer_queue.py", "hfx/workloads/arrivals.py",
    "hfx/workloads/stream_rows.py", "hfx/policies/views.py", "hfx/policies/deadline_queue.py",
    "hfx/policies/base.py", "hfx/policies/hfx.py", "hfx/policies/shadow.py",
    "hfx/policies/slo_queue.py", "hfx/policies/maturity.py", "hfx/policies/parking.py",
    "hfx/policies/prefill_demand.py", "hfx/policies/tpot_margin.py",
    "hfx/policies/prefix_index.py", "hfx/policies/output_length.py",
    "hfx/policies/round_robin.py", "hfx/policies/least_loaded.py",
    "hfx/policies/tier_split.py",
    "hfx/policies/aladdin.py", "hfx/policies/slos_serve.py", "hfx/policies/scorpio.py",
    "hfx/policies/polyserve.py", "hfx/policies/sa.py", "hfx/tally.py", "hfx/policies/hfx_pd.py",
)
MARK = "# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring."
_MANIFEST = "manifest.json"
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def key() -> str:
    """The build key of this source tree: its Python, mypyc's version and every source file."""
    h = hashlib.sha256()
    h.update(sysconfig.get_config_var("EXT_SUFFIX").encode())
    h.update(mypyc_version().encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        if not path.is_file():
            continue  # a dangling link (an editor's lock file) is no source
        h.update(str(path.relative_to(PACKAGE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def mypyc_version() -> str:
    try:
        from importlib.metadata import version
        return version("mypy")
    except Exception:  # no mypy: nothing can be built, and no build can match
        return "none"


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/hfx/native``, else ``~/.cache/hfx/native``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hfx" / "native"


def _complete(where: Path) -> dict[str, str] | None:
    """The manifest of a whole build at ``where`` (every module and the shared library there),
    else None."""
    try:
        manifest = json.loads((where / _MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = [*(m.removesuffix(".py") + _SUFFIX for m in MODULES), manifest.get("shared", "")]
    return manifest if all((where / f).is_file() for f in files) else None


def built(root: Path | None = None) -> Path | None:
    """The whole build of this source tree under ``root`` (default: the cache), or None."""
    where = (root or cache_root()) / key()
    return where if _complete(where) is not None else None


def build(root: Path | None = None, log: bool = True) -> Path:
    """Compile MODULES of this source tree into ``root/<key>`` (default: the cache) and return
    that directory; an existing build of the same key is kept. Needs mypy (the dev extra) in
    this interpreter and a C compiler; about 30 s on 2 cores. Concurrent builds of one key are
    safe: each stages its own copy, the first whole one is published, the others dropped."""
    if mypyc_version() == "none":
        raise RuntimeError("mypy is not installed in this interpreter: pip install -e '.[dev]'")
    out = (root or cache_root()) / key()
    if _complete(out) is not None:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        with tempfile.TemporaryDirectory(prefix="hfx-native-") as tmp:
            work = Path(tmp)
            shutil.copytree(PACKAGE, work / "hfx", ignore_dangling_symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", ".#*"))
            # This interpreter's mypyc: a build is for the Python that loads it.
            done = subprocess.run([sys.executable, "-m", "mypyc", *MODULES], cwd=work,
                                  capture_output=not log, text=True)
            if done.returncode:
                detail = "" if log else \
                    f":\n{(done.stdout or '')[-4000:]}{(done.stderr or '')[-4000:]}"
                raise RuntimeError(f"mypyc failed (exit {done.returncode}){detail}")
            shared = [so.name for so in work.glob(f"*__mypyc{_SUFFIX}")]
            if len(shared) != 1:
                raise RuntimeError(f"mypyc left {len(shared)} shared libraries, expected one")
            for so in work.rglob(f"*{_SUFFIX}"):
                if so.relative_to(work).parts[0] == "build":
                    continue  # mypyc's intermediate copies
                dest = staging / so.relative_to(work)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(so, dest)
        (staging / _MANIFEST).write_text(json.dumps({"key": out.name, "shared": shared[0],
                                                     "modules": list(MODULES)}))
        if _complete(staging) is None:
            raise RuntimeError(f"mypyc did not build every module of {', '.join(MODULES)}")
        if out.exists() and not _complete(out):
            shutil.rmtree(out, ignore_errors=True)  # a build cut short (never published whole)
        try:
            staging.rename(out)  # published whole, or not at all
        except OSError:
            if not _complete(out):  # not another build's win: a real failure
                raise
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Loads the compiled MODULES from a build; everything else as usual."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.names = {module_name(m) for m in MODULES}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self.names:
            return None
        so = self.where / (fullname.replace(".", "/") + _SUFFIX)
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.util.spec_from_file_location(fullname, so, loader=loader)


def active() -> bool:
    """Whether this process loads the compiled modules."""
    return any(isinstance(f, _Finder) for f in sys.meta_path)


def requested() -> bool:
    """Whether ``HFX_NATIVE`` asks for the compiled modules (set, and not ``0``)."""
    return os.environ.get("HFX_NATIVE", "") not in ("", "0")


def activate(root: Path | None = None) -> bool:
    """Load MODULES compiled from now on, if a whole build of this exact source exists;
    returns whether it does. Call it before any of them is imported (``hfx/__init__.py`` does,
    under ``HFX_NATIVE=1``)."""
    if active():
        return True
    early = sorted(n for n in map(module_name, MODULES) if n in sys.modules)
    if early:
        raise RuntimeError(f"activate() too late, imported as Python already: {', '.join(early)}")
    where = (root or cache_root()) / key()
    manifest = _complete(where)
    if manifest is None:
        return False
    # The shared library every compiled module imports by name, loaded from this build by its
    # path: mypyc names it after the module list alone, so any other build's has the same name.
    name = manifest["shared"].removesuffix(_SUFFIX)
    spec = importlib.util.spec_from_file_location(
        name, where / manifest["shared"],
        loader=importlib.machinery.ExtensionFileLoader(name, str(where / manifest["shared"])))
    assert spec is not None and spec.loader is not None
    shared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shared)
    sys.modules[name] = shared
    sys.meta_path.insert(0, _Finder(where))
    return True


def activate_from_env() -> None:
    """``HFX_NATIVE=1``: activate, or say (once per process) why this process runs as Python;
    never fail the import of ``hfx``."""
    try:
        if activate():
            return
        why = "no native build matches this source tree (run `hfx native build`)"
    except Exception as e:  # a home directory that is not there, an unreadable build, ...
        why = f"{type(e).__name__}: {e}"
    print(f"hfx: HFX_NATIVE is set but {why}; running as Python", file=sys.stderr)
