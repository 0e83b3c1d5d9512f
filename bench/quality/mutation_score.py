"""Mutation score of the scheduling core: what ``mutmut run`` found, as JSON.

Reads the result files mutmut leaves under ``mutants/`` (``*.meta``: an exit code per mutant,
mutmut's own encoding) and counts, per module, mutants killed (a test failed), survived (every
test passed), timed out (counted as killed: the mutant broke the run), and not checked. With
``--survivors``, lists every survivor with its diff (``mutmut show``) grouped by function.

    mutmut run                      # configured in pyproject.toml; hours on 2 cores
    python bench/quality/mutation_score.py --mutants mutants --json docs/results/mutation.json

Kill rate = (killed + timeout) / (checked mutants).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

from mutmut.stats import status_by_exit_code

from hfx.evaluation import write_json


def scores(root: Path) -> dict:
    by_module: dict[str, Counter] = defaultdict(Counter)
    survivors: list[str] = []
    for meta in sorted(root.rglob("*.py.meta")):
        module = str(meta.relative_to(root)).removesuffix(".meta")
        for name, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            status = status_by_exit_code[code]
            by_module[module][status] += 1
            if status == "survived":
                survivors.append(name)
    total: Counter = sum(by_module.values(), Counter())

    def rate(c: Counter) -> float | None:
        checked = c["killed"] + c["timeout"] + c["survived"]
        return (c["killed"] + c["timeout"]) / checked if checked else None

    return {
        "total": dict(total), "kill_rate": rate(total),
        "modules": {m: {**dict(c), "kill_rate": rate(c)} for m, c in sorted(by_module.items())},
        "survivors": survivors,
    }


def function_of(mutant: str) -> str:
    return re.sub(r"__mutmut_\d+$", "", mutant).replace("xǁ", "").replace("ǁ", ".")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", default="mutants", help="mutmut's mutants/ folder")
    ap.add_argument("--json", required=True)
    ap.add_argument("--survivors", help="also write every survivor's diff here (text)")
    args = ap.parse_args()
    result = scores(Path(args.mutants))
    t = result["total"]
    print(f"killed {t.get('killed', 0)}, timeout {t.get('timeout', 0)}, survived "
          f"{t.get('survived', 0)}, not checked {t.get('not checked', 0)}: kill rate "
          f"{result['kill_rate']:.1%}")
    for module, c in result["modules"].items():
        if c["kill_rate"] is not None:
            print(f"  {module:48s} {c['kill_rate']:6.1%}  survived {c.get('survived', 0)}")
    write_json(args.json, result)
    if args.survivors:
        groups: dict[str, list[str]] = defaultdict(list)
        for name in result["survivors"]:
            groups[function_of(name)].append(name)
        lines = []
        cwd = Path(args.mutants).resolve().parent
        for function, names in sorted(groups.items()):
            lines.append(f"## {function} ({len(names)})")
            for name in names:
                diff = subprocess.run(["mutmut", "show", name], cwd=cwd, capture_output=True,
                                      text=True).stdout
                lines += [ln for ln in diff.splitlines()
                          if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
            lines.append("")
        Path(args.survivors).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
