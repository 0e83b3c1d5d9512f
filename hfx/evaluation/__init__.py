"""Evaluation: what is built on the simulator and the served runs. Sweeps of (series × QPS) runs
with their tables and plots (sweep.py), run one after another, on a process pool or on a Ray
cluster (runner.py); the seeds' experiment presets (presets.py); capacity, the highest QPS a
fleet sustains at a target attainment, by bracketing and bisection over steady-state runs
(capacity.py); the comparison protocol every policy is measured under (compare.py); a trace
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
