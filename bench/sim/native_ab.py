"""What compiling the simulator's hot modules with mypyc buys: the same runs on this checkout
as Python and as a compiled copy, interleaved (``sim_ab.py``), results required identical.
Writes JSON; not a test, and nothing here changes how HFX runs: the compiled copy lives in a
temporary git worktree and is removed after.

The modules are ``hfx.native.MODULES``, what ``hfx native build`` compiles (hfx/native.py says
which and why). Here they are compiled from the commit measured, in a worktree of their own.

    python bench/sim/native_ab.py --repeat 3 --json docs/data/native_ab.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hfx.evaluation import write_json
from hfx.native import MODULES

ROOT = Path(__file__).resolve().parents[2]
CASES = ["rr@8:6000", "rr@128:24000", "hfx@32:12000", "polyserve@8:12000", "scorpio@32:12000"]


def build(rev: str, where: Path) -> tuple[Path, Path, float]:
    """Two worktrees of ``rev`` under ``where``: as it is, and with MODULES compiled."""
    plain, native = where / "python", where / "native"
    for tree in (plain, native):
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree),
                        rev], check=True)
    mypyc = Path(sys.executable).with_name("mypyc")
    start = time.perf_counter()
    done = subprocess.run([str(mypyc), *MODULES], cwd=native, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"mypyc failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return plain, native, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD", help="the commit to measure (default: HEAD)")
    ap.add_argument("--case", action="append", help=f"POLICY@INSTANCES:REQUESTS (default: "
                                                    f"{', '.join(CASES)})")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", required=True, metavar="PATH")
    args = ap.parse_args()
    where = Path(tempfile.mkdtemp(prefix="hfx-native-"))
    try:
        plain, native, seconds = build(args.rev, where)
        print(f"compiled {len(MODULES)} modules in {seconds:.0f} s", flush=True)
        ab = where / "ab.json"
        cmd = [sys.executable, str(ROOT / "bench/sim/sim_ab.py"), str(plain), str(native),
               "--repeat", str(args.repeat), "--json", str(ab)]
        for case in args.case or CASES:
            cmd += ["--case", case]
        rc = subprocess.run(cmd).returncode
        out = json.loads(ab.read_text())
        out["command"] = "python bench/sim/native_ab.py " + " ".join(sys.argv[1:])
        out["rev"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev],
                                    capture_output=True, text=True).stdout.strip()
        out["compiled"] = MODULES
        out["compile_seconds"] = seconds
        write_json(args.json, out)
        return rc
    finally:
        for tree in (where / "python", where / "native"):
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
