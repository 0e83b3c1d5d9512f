"""hfx/native.py: a compiled build is used only for the exact source it was built from.

Building takes ~30 s, so the README's suite does not build: ``.ci/run`` builds once and runs
the golden and engine-run tests under ``HFX_NATIVE=1``, where the last test here checks that
the compiled modules are really the ones loaded.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from hfx import native
from hfx.engine.sequence import Sequence
from hfx.request import Request, RequestRecord, TokenRun
from tests.helpers import native_pickles


def _tree(tmp_path: Path) -> Path:
    src = tmp_path / "hfx"
    (src / "engine").mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "engine" / "core.py").write_text("X = 1\n")
    return src


def test_the_build_key_follows_every_source_file(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "PACKAGE", _tree(tmp_path))
    first = native.key()
    assert native.key() == first  # stable
    (native.PACKAGE / "engine" / "core.py").write_text("X = 2\n")
    edited = native.key()
    (native.PACKAGE / "engine" / "new.py").write_text("")
    assert len({first, edited, native.key()}) == 3


def test_no_build_of_this_source_means_python(tmp_path, monkeypatch):
    """A build of other source (an edit since) is never loaded: activate says no, and changes
    nothing in how modules load."""
    monkeypatch.setattr(native, "PACKAGE", _tree(tmp_path))
    root = tmp_path / "builds"
    stale = root / "0123456789abcdef"
    stale.mkdir(parents=True)
    (stale / "manifest.json").write_text(json.dumps({"key": stale.name}))
    if native.requested():
        pytest.skip("this process runs compiled (HFX_NATIVE=1)")
    before = list(sys.meta_path)
    monkeypatch.setattr(native, "MODULES", ("hfx/not_imported_anywhere.py",))
    assert native.activate(root) is False
    assert list(sys.meta_path) == before


def test_activating_after_a_compiled_module_was_imported_as_python_is_refused(monkeypatch):
    if native.requested():
        pytest.skip("this process runs compiled (HFX_NATIVE=1)")
    import hfx.engine.cohort  # noqa: F401  (imported as Python)

    with pytest.raises(RuntimeError, match=r"imported as Python already: .*hfx\.engine\.cohort"):
        native.activate(Path("/nonexistent"))


def test_a_build_is_whole_only_with_every_module_and_its_shared_library(tmp_path):
    """A build cut short, or one mypyc left a module out of, is never loaded."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / "manifest.json").write_text(json.dumps({"shared": f"abc__mypyc{suffix}"}))
    files = [m.removesuffix(".py") + suffix for m in native.MODULES] + [f"abc__mypyc{suffix}"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"")
    assert native._complete(tmp_path) is not None
    (tmp_path / files[3]).unlink()
    assert native._complete(tmp_path) is None


@pytest.mark.skipif(not native.requested(), reason="HFX_NATIVE is not set")
def test_under_hfx_native_the_compiled_modules_are_the_ones_loaded():
    """.ci/run's native tier: the tests it runs must not pass as Python by accident. Every
    compiled module, and the shared library they call into, come from this source's build."""
    import importlib

    assert native.active()
    where = native.built()
    assert where is not None
    manifest = native._complete(where)
    assert manifest is not None
    for m in native.MODULES:
        module = importlib.import_module(native.module_name(m))
        assert Path(module.__file__).resolve() == (where / (m.removesuffix(".py")
                                                   + importlib.machinery.EXTENSION_SUFFIXES[0])
                                                   ).resolve(), module
    shared = sys.modules[manifest["shared"].removesuffix(importlib.machinery.EXTENSION_SUFFIXES[0])]
    assert Path(shared.__file__).resolve() == (where / manifest["shared"]).resolve()


def test_under_hfx_native_the_hot_classes_construct_in_compiled_code():
    """The classes a simulated run makes per request or per step write their ``__init__`` out:
    one that dataclasses generates is a Python function, and every construction would run it
    as Python even in a compiled build (docs/performance.md, "Compiled")."""
    if not native.active():
        pytest.skip("runs as Python: every __init__ is a Python function")
    import types

    from hfx.engine.core import PlannedStep, StepOutput
    from hfx.engine.decode_run import DecodeRun
    from hfx.engine.planners.base import SchedulerOutput
    from hfx.policies.shadow import _Inflight
    from hfx.policies.views import Decision, Dispatch, InstanceView
    from hfx.stepmodel.step_time import BatchShape

    hot = (Request, RequestRecord, TokenRun, Sequence, SchedulerOutput, DecodeRun, BatchShape,
           StepOutput, PlannedStep, Decision, Dispatch, InstanceView, _Inflight)
    generated = [c.__name__ for c in hot if isinstance(c.__init__, types.FunctionType)]
    assert generated == []


def test_what_crosses_a_process_pickles_back_equal():
    """Requests, records (with a shared tick log), sequences (a cohort member's trailing token
    count) and stats travel to front processes and Ray actors; each comes back equal."""
    for value in native_pickles.samples():
        assert native_pickles.key(pickle.loads(pickle.dumps(value))) == native_pickles.key(value)


def test_a_process_running_the_other_way_unpickles_what_this_one_pickled():
    """A compiled process and a Python one (a front, a Ray actor on a node without the build)
    exchange requests, records, sequences and stats: each side unpickles the other's, equal to
    its own (one format both ways: ``__reduce__`` through the constructor)."""
    if native.built() is None:
        pytest.skip("no build of this source (`hfx native build`; .ci/run's compiled tier has one)")
    here = native.active()
    env = {**os.environ, "HFX_NATIVE": "0" if here else "1"}
    done = subprocess.run([sys.executable, "-m", "tests.helpers.native_pickles"],
                          input=pickle.dumps(native_pickles.samples()), capture_output=True,
                          env=env, cwd=Path(__file__).resolve().parent.parent, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert f"compiled={not here}" in err  # it really ran the other way
    theirs = pickle.loads(done.stdout)
    assert [native_pickles.key(x) for x in theirs] == \
        [native_pickles.key(x) for x in native_pickles.samples()]
