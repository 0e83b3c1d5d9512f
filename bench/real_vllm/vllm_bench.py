"""HFX over real vLLM servers: policies, simulator fidelity, gateway overhead,
cold start.

Two vLLM CPU servers (one core each) serve a random-weight ``mini`` checkpoint, started once
(prefix caching off, so a policy run after another gets no cache hits from the same prompts):

1. **start and scale-out**: seconds from process start to ``/health`` of each server; and a
   Scaler launch from the warm pool (a server already up) against a cold one (a process
   start) — HyperFlexis Table 2's question, on a model of 3.3M parameters, so what is measured is
   vLLM's own start-up, not weight loading;
2. **profile**: the step-time model fitted from both servers measured at once
   (hfx/backends/vllm/profiler.py), as ``hfx serve --engine vllm`` does at start;
3. **policies**: the four-task workload (HyperFlexis Table 1's lengths and SLOs, Poisson) at each
   ``--qps``, under each ``--policies``, HFX's control plane over the two servers on the real
   clock; attainment and latencies, and the same requests simulated with the fitted profile
   (vLLM's scheduler is chunked prefill, so the simulated engines use the ``chunked`` planner
   with vLLM's token budget): mean and p90 TTFT/TPOT/E2E errors, ``--trials`` times. With
   ``--calibrate``, each measured run is preceded by a calibration run (the same rate, other
   arrivals and lengths) and also predicted with the decode scale and delivery latency fitted
   to it (hfx/evaluation/calibration.py); ``--pooled-calibration K`` serves K calibration runs
   per policy before the trials and predicts every trial with one fit on all of them; with
   ``--same-requests`` every trial serves trial 0's requests, so the trials show how far the
   real means move on identical input;
4. **gateway overhead**: TTFT of one-token requests straight to a vLLM server and through
   ``hfx serve --engine vllm --backend ...`` to the same servers, alternating, p50/p99.

    python bench/real_vllm/vllm_bench.py --vllm-python /tmp/vllm/bin/python \
        --json docs/results/vllm.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import httpx
import numpy as np

from hfx.assembly import build_cluster
from hfx.backends.vllm.metrics import parse_metrics
from hfx.backends.vllm.process import VLLMLaunch, VLLMPlacement, VLLMServer
from hfx.backends.vllm.profiler import VLLMGrid, profile_vllm
from hfx.cluster.provisioner import Plan
from hfx.config import SimConfig, parse_params
from hfx.engine import EngineConfig
from hfx.evaluation import write_json
from hfx.evaluation.calibration import Calibration, fit_calibration
from hfx.model.build import write_random_checkpoint
from hfx.records.metrics import summarize
from hfx.request import Request
from hfx.sim.clock import run
from hfx.sim.driver import drive, run_cluster
from hfx.workloads.kinds import workload_tasks
from hfx.workloads.load import generate

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import compare, hfx_serve, stats

KV_TOKENS, BLOCK, MAX_LEN, MAX_SEQS = 16384, 32, 2048, 64
VLLM_TOKEN_BUDGET = 2048  # vLLM 0.32 OpenAI server default max_num_batched_tokens on CPU


def with_prompts(requests: list[Request], seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [replace(r, prompt_token_ids=rng.integers(1, 256, r.prompt_len).tolist())
            for r in requests]


def mini_launch(vllm_python: str, checkpoint: str) -> VLLMLaunch:
    """The benches' vLLM servers: the mini checkpoint, float32, eager, no prefix caching (a
    run after another gets no hits from the same prompts), vLLM's CPU token budget, vLLM's
    own scheduler (vllm_scheduler.py sets HFX's)."""
    return VLLMLaunch(python=vllm_python, model=checkpoint, served_name="mini",
                      max_model_len=MAX_LEN, max_num_seqs=MAX_SEQS, kv_capacity_tokens=KV_TOKENS,
                      block_size=BLOCK, scheduler="stock",
                      extra_args=("--enforce-eager", "--dtype", "float32",
                                  "--no-enable-prefix-caching",
                                  "--max-num-batched-tokens", str(VLLM_TOKEN_BUDGET)))


def cold_starts(launch: VLLMLaunch, n: int) -> tuple[list[VLLMServer], list[float]]:
    """Start ``n`` servers one after another (each alone on the machine while it starts)."""
    servers, seconds = [], []
    for i in range(n):
        t = time.perf_counter()
        server = VLLMServer(launch, i, n).start()
        server.wait_ready_blocking()
        seconds.append(time.perf_counter() - t)
        servers.append(server)
        print(f"server {i} ready in {seconds[-1]:.1f} s at {server.url}", flush=True)
    return servers, seconds


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (vLLM's API server starts its engine core and
    workers as children), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The parent is the second field after the command name, which may hold spaces.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def renice_servers(servers: list[VLLMServer], nice: int) -> int:
    """Lower the servers' CPU priority (every thread of every process of theirs, as Linux
    keeps a nice value per thread), so that on a host whose cores the servers fill, the control
    plane and the load client are not the ones kept waiting: in a deployment HFX has cores of
    its own. Returns the threads reniced."""
    count = 0
    for server in servers:
        if server.pid is None:
            continue
        for pid in _descendants(server.pid):
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                try:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                    count += 1
                except OSError:
                    pass  # exited meanwhile
    return count


def scale_out(launch: VLLMLaunch) -> dict:
    """Seconds for the Scaler's launch to hand over a serving instance: from the warm pool
    (a server already up) and cold (the pool empty: a process start)."""
    placement = VLLMPlacement(launch, (), MAX_SEQS, warm_pool=1)
    placement.prepare([])
    config = EngineConfig(num_kv_blocks=KV_TOKENS // BLOCK, block_size=BLOCK)
    plan = Plan("disk", 0.0, True, False)

    async def both() -> dict:
        out = {}
        for kind, iid in (("warm", 10), ("cold", 11)):
            t = time.perf_counter()
            instance = await placement.launch(iid, config, plan)
            out[f"{kind}_s"] = time.perf_counter() - t
            print(f"{kind} scale-out: {out[f'{kind}_s']:.2f} s", flush=True)
            await instance.process.stop()
        return out

    return asyncio.run(both())


VLLM_SIDE = ("time_to_first_token", "inter_token_latency", "request_time_per_output_token",
             "request_queue_time", "request_prefill_time")


def vllm_side(urls: list[str]) -> dict[str, float]:
    """The servers' own latency histograms (sum and count), summed over the servers."""
    out: dict[str, float] = {}
    for url in urls:
        for k, v in parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text).items():
            out[k] = out.get(k, 0.0) + v
    return out


def serve_policy(config: SimConfig, requests: list[Request], profile, urls: list[str]) -> dict:
    placement = VLLMPlacement(None, tuple(urls), MAX_SEQS)
    control = build_cluster(config, profile, placement=placement,
                            tasks=workload_tasks(config.workload), seed=config.seed)
    before = vllm_side(urls)
    end = asyncio.run(drive(control, requests, f"{config.policy}@{config.qps:g}"))
    after = vllm_side(urls)
    records = list(control.records.values())
    # What vLLM itself saw, mean seconds: where the time went before HFX's clock saw a token.
    server = {}
    for name in VLLM_SIDE:
        key = f"vllm:{name}_seconds"
        n = after.get(f"{key}_count", 0) - before.get(f"{key}_count", 0)
        if n:
            server[name] = (after[f"{key}_sum"] - before.get(f"{key}_sum", 0)) / n
    return {"summary": summarize(records, [(0.0, end)]), "stats": stats(records),
            "seconds": end, "vllm_side": server, "per_instance": per_instance(records)}


def per_instance(records: list) -> dict[str, int]:
    """Requests each instance served (the placement's balance)."""
    return dict(sorted(Counter(str(r.instance) for r in records).items()))


def simulate(config: SimConfig, requests: list[Request], profile) -> dict:
    control, _ = run(run_cluster(config, requests, profile), virtual=True)
    records = list(control.records.values())
    return {"summary": summarize(records, [(0.0, 0.0)]), "stats": stats(records),
            "per_instance": per_instance(records)}


def pooled(runs: list[dict]) -> tuple[float, float]:
    """Mean TTFT and TPOT over every finished request of several runs' stats."""
    n = sum(r["all"]["finished"] for r in runs)

    def mean(metric: str) -> float:
        return sum(r["all"][metric]["mean"] * r["all"]["finished"] for r in runs) / n

    return mean("ttft"), mean("tpot")


def calibrate(runs: list[tuple[SimConfig, list[Request]]], profile, urls: list[str]
              ) -> tuple[Calibration, list[dict]]:
    """Serve calibration runs; fit the decode scale and delivery latency to their pooled mean
    TTFT and TPOT. Returns the fit and each run's real stats."""
    real = [serve_policy(config, requests, profile, urls)["stats"] for config, requests in runs]

    def means(model) -> tuple[float, float]:
        scaled = replace(profile, model=model)
        return pooled([simulate(config, requests, scaled)["stats"] for config, requests in runs])

    return fit_calibration(profile.model, means, *pooled(real)), real


def calibration_runs(config: SimConfig, seeds: range, per_task: int
                     ) -> list[tuple[SimConfig, list[Request]]]:
    """The measured run's workload and rate with other arrivals and lengths (seeds >= 100)."""
    return [(config.model_copy(update={"seed": s}),
             with_prompts(generate("four-task", config.qps, s, per_task), s)) for s in seeds]


def vllm_config(policy: str, qps: float, seed: int) -> SimConfig:
    """The simulated twin of the two servers: vLLM's chunked prefill and token budget.
    ``policy`` is a name, or ``NAME:KEY=VALUE,...`` with policy parameters (a variant)."""
    name, _, spec = policy.partition(":")
    return SimConfig(policy=name, policy_params=parse_params(spec), qps=qps, instances=2, seed=seed,
                     max_num_seqs=MAX_SEQS, kv_capacity_tokens=KV_TOKENS, block_size=BLOCK,
                     planner="chunked", max_num_batched_tokens=VLLM_TOKEN_BUDGET,
                     step_noise=0.0)


def predict(config: SimConfig, requests: list[Request], profile, fit: Calibration) -> dict:
    """Simulated stats under a calibration: the scaled model, then the delivery latency."""
    scaled = replace(profile, model=fit.apply(profile.model))
    return delivered(simulate(config, requests, scaled)["stats"], fit.delivery)


def delivered(stats_: dict, delivery: float) -> dict:
    """Simulated stats with every token seen ``delivery`` seconds later: TTFT and E2E move by
    it (mean and p90 alike, a constant), TPOT does not."""
    return {g: {m: ({k: v + delivery for k, v in x.items()} if m in ("ttft", "e2e") else x)
                for m, x in s.items()} for g, s in stats_.items()}


async def ttft(client: httpx.AsyncClient, url: str, model: str, prompt: list[int]) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "stream": True,
            "temperature": 0}
    t = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - t
    raise RuntimeError(f"no token from {url}")


def overhead(urls: list[str], checkpoint: str, profile_path: str, n: int) -> dict:
    args = ["--engine", "vllm", "--checkpoint", checkpoint, "--instances", str(len(urls)),
            "--profile", profile_path, "--max-model-len", str(MAX_LEN), "--policy", "rr"]
    for u in urls:
        args += ["--backend", u]
    with hfx_serve(*args, start_timeout=120) as live:
        async def measure() -> dict:
            direct, through = [], []
            gen = np.random.default_rng(1)
            async with httpx.AsyncClient(timeout=60) as client:
                model = (await client.get(f"{urls[0]}/v1/models")).json()["data"][0]["id"]
                for i in range(n + 5):
                    prompt = gen.integers(1, 256, 64).tolist()
                    a = await ttft(client, urls[i % len(urls)], model, prompt)
                    b = await ttft(client, live.url, live.model, prompt[::-1])
                    if i >= 5:  # warm-up
                        direct.append(a)
                        through.append(b)
            return {"direct": direct, "through": through}

        t = asyncio.run(measure())

    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q) * 1e3)

    added = [b - a for a, b in zip(t["direct"], t["through"], strict=True)]
    return {"requests": n, "prompt_tokens": 64,
            "direct_ttft_ms": {"p50": pct(t["direct"], 50), "p99": pct(t["direct"], 99)},
            "hfx_ttft_ms": {"p50": pct(t["through"], 50), "p99": pct(t["through"], 99)},
            "added_ms": {"p50": pct(added, 50), "p99": pct(added, 99)},
            "serve_args": " ".join(a if not a.startswith("http") else "URL" for a in args)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", default=sys.executable)
    ap.add_argument("--policies", default="hfx,rr")
    ap.add_argument("--qps", type=float, nargs="+", default=[3.0, 6.0])
    ap.add_argument("--requests-per-task", type=int, default=40)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--overhead-requests", type=int, default=100)
    ap.add_argument("--calibrate", action="store_true",
                    help="a calibration run before each measured run "
                         "(hfx/evaluation/calibration.py)")
    ap.add_argument("--pooled-calibration", type=int, default=0, metavar="K",
                    help="K calibration runs per policy and rate before the trials, one fit on "
                         "all of them, every trial predicted with it")
    ap.add_argument("--same-requests", action="store_true",
                    help="every trial serves trial 0's requests (the real system's spread)")
    ap.add_argument("--no-scale-out", action="store_true", help="skip the scale-out timing")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hfx-vllm-bench-"))
    checkpoint = str(write_random_checkpoint("mini", work / "mini"))
    launch = mini_launch(args.vllm_python, checkpoint)
    servers, starts = cold_starts(launch, 2)
    urls = [s.url for s in servers]
    result: dict = {"command": "python bench/real_vllm/vllm_bench.py " + " ".join(sys.argv[1:]),
                    "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
                    "model": "mini (3.3M parameters, random weights), float32, vLLM 0.32.0 CPU",
                    "cold_start_s": starts, "runs": []}
    try:
        if not args.no_scale_out:
            result["scale_out"] = scale_out(launch)
        profile = profile_vllm(urls, VLLMGrid.quick(), KV_TOKENS, BLOCK, checkpoint,
                               progress=True)
        profile_path = str(work / "mini@vllm.json")
        profile.save(profile_path)
        result["profile"] = {"model": asdict(profile.model), "fit_mape": profile.fit_mape}
        pools: dict[tuple[float, str], tuple[Calibration, list[dict]]] = {}
        for qps in args.qps if args.pooled_calibration else ():
            for policy in args.policies.split(","):
                base = vllm_config(policy, qps, 0)
                fit, real = calibrate(calibration_runs(
                    base, range(200, 200 + args.pooled_calibration), args.requests_per_task),
                    profile, urls)
                pools[qps, policy] = fit, real
                print(f"pooled calibration {policy}@{qps:g} over {len(real)} runs: decode "
                      f"x{fit.decode_scale:.2f}, delivery {fit.delivery * 1e3:.0f} ms", flush=True)
        result["pooled_calibration"] = [
            {"qps": q, "policy": p, **asdict(fit), "real": real}
            for (q, p), (fit, real) in pools.items()]
        for trial in range(args.trials):
            for qps in args.qps:
                seed = 0 if args.same_requests else trial
                requests = with_prompts(generate("four-task", qps, seed, args.requests_per_task),
                                        seed)
                for policy in args.policies.split(","):
                    config = vllm_config(policy, qps, seed)
                    fit = None
                    if args.calibrate:  # other arrivals and lengths, the same rate
                        fit, (cal_real,) = calibrate(calibration_runs(
                            config, range(100 + trial, 101 + trial), args.requests_per_task),
                            profile, urls)
                    real = serve_policy(config, requests, profile, urls)
                    sim = simulate(config, requests, profile)
                    run_ = {"trial": trial, "qps": qps, "policy": policy, "seed": seed,
                            "requests": len(requests),
                            "attainment": real["summary"]["attainment"],
                            "sim_attainment": sim["summary"]["attainment"],
                            "real": real["stats"], "sim": sim["stats"],
                            "vllm_side_mean_s": real["vllm_side"],
                            "error": compare(real["stats"], sim["stats"])}
                    if fit is not None:
                        calibrated = predict(config, requests, profile, fit)
                        run_["calibration"] = asdict(fit) | {"real": cal_real}
                        run_["sim_calibrated"] = calibrated
                        run_["error_calibrated"] = compare(real["stats"], calibrated)
                    if (qps, policy) in pools:
                        calibrated = predict(config, requests, profile, pools[qps, policy][0])
                        run_["sim_pooled"] = calibrated
                        run_["error_pooled"] = compare(real["stats"], calibrated)
                        c = run_["error_pooled"]["all"]
                        print(f"  pooled calibration: ttft {c['ttft']['mean']:+.1%} tpot "
                              f"{c['tpot']['mean']:+.1%} e2e {c['e2e']['mean']:+.1%}", flush=True)
                    result["runs"].append(run_)
                    e = run_["error"]["all"]
                    print(f"trial {trial} {policy}@{qps:g}: attainment real "
                          f"{run_['attainment']:.3f} sim {run_['sim_attainment']:.3f}; mean err "
                          f"ttft {e['ttft']['mean']:+.1%} tpot {e['tpot']['mean']:+.1%} "
                          f"e2e {e['e2e']['mean']:+.1%}", flush=True)
                    if fit is not None:
                        c = run_["error_calibrated"]["all"]
                        print(f"  calibrated (decode x{fit.decode_scale:.2f}, delivery "
                              f"{fit.delivery * 1e3:.0f} ms): ttft {c['ttft']['mean']:+.1%} tpot "
                              f"{c['tpot']['mean']:+.1%} e2e {c['e2e']['mean']:+.1%}", flush=True)
                    if args.json:
                        write_json(args.json, result)
        if args.overhead_requests:
            result["overhead"] = overhead(urls, checkpoint, profile_path,
                                          args.overhead_requests)
            print(result["overhead"])
    finally:
        for s in servers:
            s.kill()
    if args.json:
        write_json(args.json, result)
    for key in ("error", "error_calibrated", "error_pooled"):
        runs = [r for r in result["runs"] if key in r]
        if runs:
            print(f"median |mean {key}| over runs: " + ", ".join(
                f"{m} {statistics.median(abs(r[key]['all'][m]['mean']) for r in runs):.1%}"
                for m in ("ttft", "tpot", "e2e")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
