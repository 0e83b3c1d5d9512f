"""The simulator's hot modules compiled by mypyc, opt in: ``hfx native build``, then
``HFX_NATIVE=1`` for any ``hfx`` command or script.

The same source, compiled: one engine, not two (issue 31). A build is made for exactly the
source tree it came from: its key hashes every ``.py`` file of the package, and a process whose
source differs from the build's (an edit since) runs as plain Python and says so once on
stderr, rather than run stale code. Builds live outside the tree
(``~/.cache/hfx/native/<key>``); nothing in the source tree changes.

Compiled: the engine core and its planners, requests and records, the ledger, the control
plane, the fleet and the local instance driver, the per-step and per-request path of a simulated
run. What travels to other processes pickles compiled too (``serializable``; a frozen class
through its constructor, ``__reduce__``). Not compiled: ``Admission`` (a frozen class proxies
hold), the policies (a Python class cannot derive from a compiled one, and every policy derives
from ``Policy``), the executors (tests subclass them), the request stream (copied with
``copy.copy``), the clock (its loop derives from asyncio's Python classes). Results are
bit-identical to plain Python (the golden runs, in CI); speed: docs/performance.md, "Compiled".
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
    "hfx/engine/block_manager.py", "hfx/engine/cohort.py", "hfx/engine/core.py",
    "hfx/engine/decode_run.py", "hfx/engine/sequence.py", "hfx/engine/stats.py",
    "hfx/engine/waiting.py", "hfx/request.py",
    "hfx/engine/planners/base.py", "hfx/engine/planners/chunked.py",
    "hfx/engine/planners/credit.py", "hfx/engine/planners/deadline_chunked.py",
    "hfx/engine/planners/prefill_first.py", "hfx/engine/planners/slo_paced.py",
    "hfx/engine/planners/tpot_chunked.py", "hfx/cluster/ledger.py", "hfx/cluster/control.py",
    "hfx/cluster/fleet.py", "hfx/cluster/stage.py", "hfx/backends/local.py",
    "hfx/workloads/columns.py",
)
_MANIFEST = "manifest.json"
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def key() -> str:
    """The build key of this source tree: its Python, mypyc's version and every source file."""
    h = hashlib.sha256()
    h.update(sysconfig.get_config_var("EXT_SUFFIX").encode())
    h.update(_mypyc_version().encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(str(path.relative_to(PACKAGE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _mypyc_version() -> str:
    try:
        from importlib.metadata import version
        return version("mypy")
    except Exception:  # no mypy: nothing can be built, and no build can match
        return "none"


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hfx" / "native"


def build(root: Path | None = None, log: bool = True) -> Path:
    """Compile MODULES of this source tree into ``root/<key>`` (default: the cache) and return
    that directory; an existing build of the same key is kept. Needs mypy (the dev extra) and
    a C compiler; about 30 s on 2 cores."""
    out = (root or cache_root()) / key()
    if (out / _MANIFEST).exists():
        return out
    mypyc = shutil.which("mypyc", path=str(Path(sys.executable).parent)) or shutil.which("mypyc")
    if mypyc is None:
        raise RuntimeError("mypyc not found: install the dev extra (pip install -e '.[dev]')")
    with tempfile.TemporaryDirectory(prefix="hfx-native-") as tmp:
        work = Path(tmp)
        shutil.copytree(PACKAGE, work / "hfx",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        done = subprocess.run([mypyc, *MODULES], cwd=work, capture_output=not log, text=True)
        if done.returncode:
            detail = "" if log else f":\n{(done.stdout or '')[-4000:]}{(done.stderr or '')[-4000:]}"
            raise RuntimeError(f"mypyc failed (exit {done.returncode}){detail}")
        staging = out.with_name(out.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for so in work.rglob(f"*{_SUFFIX}"):
            if "build" in so.relative_to(work).parts[:1]:
                continue  # mypyc's intermediate copies
            dest = staging / so.relative_to(work)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, dest)
    (staging / _MANIFEST).write_text(json.dumps({"key": out.name, "modules": list(MODULES)}))
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)  # whole or absent: a build cut short is never found
    return out


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


def activate(root: Path | None = None) -> bool:
    """Load MODULES compiled from now on, if a build of this exact source exists; returns
    whether it does. Call it before any of them is imported (``hfx/__init__.py`` does, under
    ``HFX_NATIVE=1``)."""
    if active():
        return True
    early = sorted(n for n in map(module_name, MODULES) if n in sys.modules)
    if early:
        raise RuntimeError(f"activate() too late, imported as Python already: {', '.join(early)}")
    where = (root or cache_root()) / key()
    if not (where / _MANIFEST).exists():
        return False
    sys.path.append(str(where))  # mypyc's shared library, which every compiled module loads
    sys.meta_path.insert(0, _Finder(where))
    return True


def activate_from_env() -> None:
    """``HFX_NATIVE=1``: activate, or say once why this process runs as Python."""
    if not activate():
        print("hfx: HFX_NATIVE is set but no native build matches this source tree "
              "(run `hfx native build`); running as Python", file=sys.stderr)
