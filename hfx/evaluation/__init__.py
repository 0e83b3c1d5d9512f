"""Evaluation: workloads (Table 1 tasks, arrivals, traces), metrics (attainment, latency,
cost), and what is built on them: sweeps, the seeds' experiment presets, the live-server client."""


def write_json(path: str, obj: object) -> None:
    """Write a benchmark's result (folders created), and say where."""
    import json
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2) + "\n")
    print(f"wrote {path}")
