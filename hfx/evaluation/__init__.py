"""Evaluation: what is built on the simulator and the served runs. Sweeps of (series × QPS) runs
with their tables and plots (sweep.py), run one after another, on a process pool or on a Ray
cluster (runner.py); the seeds' experiment presets (presets.py); capacity, the highest QPS a
fleet sustains at a target attainment, by bracketing and bisection over steady-state runs
(capacity.py) and the most any policy could carry, counting work only (bound.py); the
comparison protocol every policy is measured under (compare.py); a trace
under every policy and fleet size (whatif.py); a profile calibrated on served runs
(calibration.py); and the client that drives a live server (client.py). The workloads are
hfx/workloads/, the metrics hfx/records/.
"""


def write_json(path: str, obj: object) -> None:
    """Write a benchmark's result (folders created), and say where."""
    import json
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2) + "\n")
    print(f"wrote {path}")


def code_commit() -> str:
    """The commit a benchmark ran at, ``+dirty`` when the package (hfx/) differs from it, so a
    table never mixes cells of different code unnoticed; "unknown" outside a git checkout."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--", "hfx"],
                               capture_output=True).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
