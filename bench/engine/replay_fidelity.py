"""A recorded run, replayed: what ``hfx serve --record`` wrote, run again on the
simulator with the profile written beside it, against what was served.

1. ``hfx serve`` on the real engine (TorchExecutor, random weights, CPU), one instance, with
   ``--record`` and live calibration (``--calibrate-every``), driven by ``hfx bench`` with the
   four-task workload (Table 1 lengths and SLOs, Poisson arrivals).
2. ``hfx sim --workload RECORD --profile RECORD.profile.json``: the same arrivals, lengths and
   SLOs, the policy and fleet that served them, the profile the dispatcher last planned with.
3. Attainment (Eq. 4: TTFT met and mean TPOT met) and mean TTFT / TPOT, served (from the
   record's own latencies) against replayed; the relative errors of the means. The replay
   delays every token by the delivery latency the live calibration fitted (the profile's
   ``meta.token_delivery_seconds``, as ``hfx sim`` does by default); it runs once more
   without it (``--token-delivery 0``) to show what that latency is worth.

    python bench/engine/replay_fidelity.py --json docs/data/replay_fidelity.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean, median
from typing import Any

import httpx

from hfx.backends.vllm.process import free_port
from hfx.config import SimConfig
from hfx.evaluation import write_json
from hfx.sim.driver import simulate


def served_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Eq. 4 attainment over every request, and mean TTFT / TPOT of the finished ones."""
    def met(r: dict[str, Any]) -> bool:
        slo = r["slo"]
        return (r["outcome"] == "finished" and slo is not None and r["ttft_s"] is not None
                and r["ttft_s"] <= slo["ttft_ms"] / 1e3
                and (r["tpot_s"] is None or r["tpot_s"] <= slo["tpot_ms"] / 1e3))

    done = [r for r in rows if r["outcome"] == "finished"]
    return {"requests": len(rows), "finished": len(done),
            "attainment": sum(map(met, rows)) / len(rows),
            "ttft_mean": mean(r["ttft_s"] for r in done),
            "tpot_mean": mean(r["tpot_s"] for r in done if r["tpot_s"] is not None)}


def serve_and_record(args: argparse.Namespace, record: Path, seed: int) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "hfx.cli", "serve", "--port", str(port), "--instances", "1",
         "--policy", args.policy, "--shape", args.shape, "--record", str(record),
         "--calibrate-every", str(args.calibrate_every)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"hfx serve exited: {server.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("hfx serve did not become ready")
            time.sleep(0.5)
        subprocess.run([sys.executable, "-m", "hfx.cli", "bench", "--target", url,
                        "--workload", "four-task", "--qps", str(args.qps),
                        "--requests-per-task", str(args.requests_per_task), "--seed",
                        str(seed)], check=True, stdout=subprocess.DEVNULL)
    finally:
        server.send_signal(signal.SIGTERM)  # drains; the recorder writes its last rows
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def replay_once(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Serve and record one run of ``seed``; replay it with the recorded profile, with its
    delivery latency (as ``hfx sim`` does by default) and without."""
    with tempfile.TemporaryDirectory(prefix="hfx-replay-") as tmp:
        record = Path(tmp) / "served.jsonl"
        t0 = time.monotonic()
        serve_and_record(args, record, seed)
        served_s = time.monotonic() - t0
        rows = [json.loads(line) for line in record.read_text().splitlines()]
        profile = json.loads((Path(f"{record}.profile.json")).read_text())
        config = SimConfig(workload=str(record), profile=f"{record}.profile.json",
                           instances=1, policy=args.policy)
        replays = {"replayed": simulate(config),
                   "replayed_without_delivery": simulate(config.model_copy(
                       update={"token_delivery": 0.0}))}
    served = served_metrics(rows)
    out: dict[str, Any] = {"seed": seed, "served_seconds": round(served_s, 1),
                           "decode_scale": profile.get("meta", {}).get("decode_scale"),
                           "token_delivery_seconds": profile.get("meta", {}).get(
                               "token_delivery_seconds"), "served": served}
    for name, replay in replays.items():
        replayed = {"requests": replay["requests"], "finished": replay["finished"],
                    "attainment": replay["attainment"], "ttft_mean": replay["ttft"]["mean"],
                    "tpot_mean": replay["tpot"]["mean"]}
        error = {k: (replayed[k] - served[k]) / served[k] for k in ("ttft_mean", "tpot_mean")}
        error["attainment_points"] = replayed["attainment"] - served["attainment"]
        out[name] = {**replayed, "error": error}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shape", default="tiny", help="model shape served (random weights)")
    p.add_argument("--policy", default="rr")
    p.add_argument("--qps", type=float, default=4.0)
    p.add_argument("--requests-per-task", type=int, default=40)
    p.add_argument("--seeds", default="0,1,2", help="workload seeds: one served run each")
    p.add_argument("--calibrate-every", type=float, default=15.0)
    p.add_argument("--json", default="docs/data/replay_fidelity.json")
    args = p.parse_args()

    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        run = replay_once(args, seed)
        runs.append(run)
        for name in ("replayed", "replayed_without_delivery"):
            e = run[name]["error"]
            print(f"seed {seed} {name:<26} attainment {run['served']['attainment']:.3f} -> "
                  f"{run[name]['attainment']:.3f}  TTFT {e['ttft_mean']:+.1%}  "
                  f"TPOT {e['tpot_mean']:+.1%}", flush=True)
    summary = {name: {k: median(abs(r[name]["error"][k]) for r in runs)
                      for k in ("ttft_mean", "tpot_mean", "attainment_points")}
               for name in ("replayed", "replayed_without_delivery")}
    out = {"what": "recorded hfx serve runs (torch engine, CPU) replayed by hfx sim",
           "command": sys.argv, "args": vars(args), "runs": runs,
           "median_abs_error": summary}
    write_json(args.json, out)
    print("median |error| of the means:", summary)


if __name__ == "__main__":
    main()
