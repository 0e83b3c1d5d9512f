"""Every module mypyc compiles says so in its first line, and no other module does: whoever
edits one sees that hfx/native.py's rules hold there (issue 51)."""

from __future__ import annotations

from pathlib import Path

from hfx.native import MARK, MODULES

ROOT = Path(__file__).resolve().parents[1]


def marked(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in sorted((root / "hfx").rglob("*.py"))
            if p.read_text().split("\n", 1)[0] == MARK}


def test_the_compiled_modules_and_only_they_carry_the_mark():
    found = marked(ROOT)
    assert len(found) > 40  # the sources were read where they are
    assert sorted(found - set(MODULES)) == [], "marked but not compiled"
    assert sorted(set(MODULES) - found) == [], "compiled but not marked"


def test_the_check_fails_on_a_module_that_lost_its_mark(tmp_path):
    (tmp_path / "hfx").mkdir()
    (tmp_path / "hfx" / "a.py").write_text(MARK + "\nx = 1\n")
    (tmp_path / "hfx" / "b.py").write_text('"""b."""\n' + MARK + "\n")
    assert marked(tmp_path) == {"hfx/a.py"}


def test_a_long_simulation_that_runs_as_python_says_so_in_one_line(monkeypatch):
    from hfx import native
    from hfx.cli.sim import not_compiled_note
    from hfx.config import SimConfig

    long = SimConfig(qps=1000, duration=600, warmup=60)
    note = not_compiled_note(long)
    assert note is not None and "hfx native build" in note and "\n" not in note
    assert "600,000 requests" in note
    assert not_compiled_note(SimConfig(qps=100, duration=60)) is None  # short
    assert not_compiled_note(SimConfig(qps=100)) is None  # a finite task set
    monkeypatch.setattr(native, "active", lambda: True)
    assert not_compiled_note(long) is None  # compiled: nothing to say
