"""The ``hfx`` command line: ``hfx sim``, ``hfx sweep``, ``hfx profile``, ``hfx list``.

Flags of ``sim`` and ``sweep`` are generated from the fields of hfx.config.SimConfig, so each flag
carries the field's help text and default; ``--config FILE.yaml`` sets any of them from a file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from hfx.config import (
    ProfileConfig,
    ServeConfig,
    SimConfig,
    add_model_args,
    model_from_args,
)
from hfx.evaluation import write_json

if TYPE_CHECKING:
    from pydantic import BaseModel

    from hfx.stepmodel.latency import Profile

_Schema = TypeVar("_Schema", bound="BaseModel")


def _config(schema: type[_Schema], args: argparse.Namespace, config_file: str | Path | None,
            /, **overrides: Any) -> _Schema:
    """model_from_args, typed: it builds an instance of ``schema`` but its signature says
    BaseModel."""
    return cast(_Schema, model_from_args(schema, args, config_file, **overrides))


def _csv(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            items = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list: {text!r}") from None
        if not items:
            raise argparse.ArgumentTypeError("expected at least one value")
        return items
    return parse


def _summary(r: dict) -> str:
    def d(key: str) -> str:
        m = r[key]
        return "-" if m["mean"] is None else f"mean {m['mean']:.3f}  p50 {m['p50']:.3f}  " \
            f"p90 {m['p90']:.3f}  p99 {m['p99']:.3f}"
    lines = [
        f"policy {r['policy']}  workload {r['workload']}  qps {r['qps']:g}  instances "
        f"{r['instances']}  profile {r['profile']}",
        f"requests {r['requests']}  finished {r['finished']}  rejected {r['rejected']}  "
        f"shed {r['shed']}  failed {r['failed']}",
        f"attainment {r['attainment']:.3f}  (deadline-based {r['attainment_dslo']:.3f})  "
        f"goodput {r['goodput_rps']:.2f} req/s  cost {r['cost_units']} units",
        f"TTFT s  {d('ttft')}",
        f"TPOT s  {d('tpot')}",
        f"E2E s   {d('e2e')}",
        "per task: " + "  ".join(f"{t} {v['attainment']:.3f}" for t, v in r["per_task"].items()),
        f"simulated {r['sim_seconds']:.1f} s in {r['wall_seconds']:.2f} s wall "
        f"({r['sim_seconds'] / max(r['wall_seconds'], 1e-9):.0f}x)",
    ]
    return "\n".join(lines)


def cmd_sim(args: argparse.Namespace) -> int:
    from hfx.sim import simulate

    config = _config(SimConfig, args, args.config)
    result = simulate(config, progress=True)
    print(_summary(result))
    if args.json:
        write_json(args.json, result)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from hfx.evaluation.presets import PRESETS
    from hfx.evaluation.sweep import capacity_table, ratio_table, run_grid, table, write

    preset = None
    if args.preset:
        try:
            preset = PRESETS[args.preset]
        except KeyError:
            raise ValueError(f"unknown preset {args.preset!r}; choose one of "
                             f"{', '.join(PRESETS)}") from None
    series = preset.series if preset else [(p, {"policy": p}) for p in args.policies]
    qps = args.qps or (list(preset.qps) if preset else [20, 40, 60, 80, 100, 120, 140, 160])
    fixed = {"workload": preset.workload, **preset.config} if preset else {}
    # The base carries the preset's fixed fields only: a series' fields must not leak into the
    # next series. Each series is validated before anything runs.
    base = _config(SimConfig, args, args.config, **fixed, qps=qps[0])
    for _, fields in series:
        model_from_args(SimConfig, args, args.config, **{**fixed, **fields, "qps": qps[0]})
    results = run_grid(base, series, qps, jobs=args.jobs, seeds=args.seeds,
                       ray_address=args.ray_address)
    print(table(results))
    if preset and preset.ratios:
        print(ratio_table(results, preset.ratios))
    print(capacity_table(results))
    name = args.name or args.preset or f"sweep-{Path(base.workload).stem}"
    title = (preset.description if preset else
             f"{base.workload}, {base.instances} instances, {base.model} on {base.hardware}")
    json_path, png_path = write(results, args.out, name, title)
    print(f"wrote {json_path} and {png_path}")
    return 0


def cmd_whatif(args: argparse.Namespace) -> int:
    from hfx.evaluation.whatif import plot, table, whatif

    config = _config(SimConfig, args, args.config, workload=args.trace,
                     policy=args.policies[0], instances=args.instances[0])
    result = whatif(config, args.policies, args.instances, args.target, args.jobs,
                    args.ray_address)
    print(table(result))
    if args.json:
        write_json(args.json, result)
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    from hfx.evaluation.capacity import capacity

    config = _config(SimConfig, args, args.config)
    result = capacity(config, args.seeds, args.target, args.tolerance, args.jobs,
                      args.ray_address)
    for s in result["seeds"]:
        probes = "  ".join(f"{p['qps']:.4g}:{p['attainment']:.3f}" for p in s["probes"])
        print(f"seed {s['seed']}: {s['capacity']:.4g} QPS   (qps:attainment  {probes})")
    print(f"{result['policy']} on {result['workload']}, {result['instances']} instances: "
          f"capacity at {result['target']:.0%} attainment {result['capacity_mean']:.4g} ± "
          f"{result['capacity_std']:.2g} QPS ({result['per_instance_mean']:.4g} per instance; "
          f"{len(result['seeds'])} seeds, {result['duration']:g} s steady state after "
          f"{result['warmup']:g} s warm-up)")
    if args.json:
        write_json(args.json, result)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from hfx.engine.planners import PLANNERS
    from hfx.policies import POLICIES
    from hfx.stepmodel.profiles import shipped_profiles
    from hfx.workloads.tasks import BURSTY, TIERED, WORKLOADS

    print("policies: ", ", ".join(POLICIES))
    print("planners: ", ", ".join(PLANNERS))
    print("workloads:", ", ".join(f"{w} ({', '.join(t.name for t in ts)})"
                                  for w, ts in WORKLOADS.items()),
          "; ramp (the priority ramp, HyperFlexis §9.1); " + ", ".join(TIERED)
          + " (PolyServe's setting, PolyServe §5.1); " + ", ".join(BURSTY)
          + " (four-task, 30 s at half the rate, 10 s at 2.5×); or a .jsonl/.csv trace")
    print("profiles: ", ", ".join(shipped_profiles()))
    from hfx.model.shapes import SHAPES

    print("shapes:   ", ", ".join(SHAPES), "(random-weight models for hfx profile; or "
          "--checkpoint DIR)")
    from hfx.evaluation.presets import PRESETS

    print("presets:")
    for name, p in PRESETS.items():
        print(f"  {name:16s} {p.description}")
    return 0


def _profile_vllm(config: ProfileConfig) -> Profile:
    """Fit the step-time model from a vLLM server: ``--backend``, else one started here."""
    from hfx.backends.vllm.metrics import server_info
    from hfx.backends.vllm.process import VLLMLaunch, VLLMServer
    from hfx.backends.vllm.profiler import VLLMGrid, profile_vllm

    server = None
    if config.backend:
        urls = list(config.backend)
    elif config.checkpoint is not None:
        launch = VLLMLaunch.of(config, config.checkpoint, Path(config.checkpoint).name,
                               max_model_len=4096, max_num_seqs=256,
                               kv_capacity_tokens=config.kv_tokens,
                               block_size=config.block_size, device=config.device)
        print("starting a vLLM server ...", flush=True)
        server = VLLMServer(launch, 0, 1).start()
        server.wait_ready_blocking()
        urls = [server.url]
    else:
        raise ValueError("--engine vllm needs --backend URL or --checkpoint DIR")
    try:
        info = server_info(urls[0])
        grid = VLLMGrid.quick() if config.quick else VLLMGrid()
        if config.repeats is not None:
            grid = replace(grid, repeats=config.repeats)
        return profile_vllm(urls, grid, info.kv_total_blocks * info.block_size,
                            info.block_size, config.checkpoint, progress=True)
    finally:
        if server is not None:
            server.kill()


def cmd_profile(args: argparse.Namespace) -> int:
    config = _config(ProfileConfig, args, args.config)
    if config.engine == "vllm":
        profile = _profile_vllm(config)
    else:
        try:
            from hfx.engine.profiler import Grid, profile_model
            from hfx.model.build import build_model
        except ImportError as e:
            raise ValueError(f"hfx profile needs the torch extra ({e}); install the CPU build "
                             "with: pip install torch==2.13.0 && pip install -e '.[torch]'"
                             ) from None
        loaded = build_model(config.shape, config.checkpoint, config.dtype, config.device,
                             config.weight_seed)
        grid = Grid.quick() if config.quick else Grid.full()
        if config.repeats is not None:
            grid = replace(grid, repeats=config.repeats)
        profile = profile_model(loaded, grid, config.kv_tokens, config.block_size,
                                progress=True)
    Path(config.out).parent.mkdir(parents=True, exist_ok=True)
    profile.save(config.out)
    m = profile.model
    print(f"{profile.name}: {len(profile.meta['samples']['prefill'])} prefill and "
          f"{len(profile.meta['samples']['decode'])} decode points on {profile.meta['device']}")
    print(f"  prefill  a={m.prefill_a:.3e} b={m.prefill_b:.3e} c={m.prefill_c:.3e}")
    print(f"  decode   a={m.decode_a:.3e} b={m.decode_b:.3e} c={m.decode_c:.3e}")
    print("  MAPE     " + "  ".join(f"{k} {v:.1%}" for k, v in profile.fit_mape.items()))
    print(f"wrote {config.out}")
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    try:
        from hfx.model.build import write_random_checkpoint
    except ImportError as e:
        raise ValueError(f"hfx checkpoint needs the torch extra ({e}): pip install "
                         "torch==2.13.0 && pip install -e '.[torch]'") from None
    path = write_random_checkpoint(args.shape, args.out, args.weight_seed, args.dtype)
    print(f"wrote {args.shape} random weights and the byte tokenizer to {path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    env_key = os.environ.get("HFX_API_KEY") or None  # as vLLM's VLLM_API_KEY
    config = _config(ServeConfig, args, args.config)
    if config.api_key is None and env_key is not None:
        config = config.model_copy(update={"api_key": env_key})
    try:
        from hfx.serving.build import build_server
        from hfx.serving.gateway import Access, serve
    except ImportError as e:
        raise ValueError(f"hfx serve needs the serve extra ({e}): pip install -e '.[serve]'"
                         + (" and the torch extra" if config.executor == "torch" else "")
                         ) from None
    try:
        server = build_server(config)
    except ImportError as e:
        raise ValueError(f"--executor torch needs the torch extra ({e}): pip install "
                         "torch==2.13.0 && pip install -e '.[torch,serve]'; or --executor sim"
                         ) from None
    engines = (f"{len(server.control.instances)} vLLM servers" if config.engine == "vllm"
               else f"{config.executor} executor")
    print(f"serving {server.options.model_name} on http://{config.host}:{config.port}/v1 "
          f"({engines}, {config.policy} policy)")
    workers = config.num_api_workers
    if workers > 1:  # the control plane here, HTTP and streams in front processes
        from hfx.serving.tree import ProcessTree

        tree = ProcessTree(server, Access.of(config), config.host, config.port, workers,
                           config.shutdown_timeout, config.upstream_idle_timeout,
                           tokens_at_front=config.engine == "vllm")
        print(f"{workers} front processes on port {tree.port}")
        code = tree.run()
        print("stopped")
        return code
    serve(server, Access.of(config), config.host, config.port, config.shutdown_timeout)
    print("stopped")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        from hfx.evaluation.client import bench
    except ImportError as e:
        raise ValueError(f"hfx bench needs httpx ({e}): pip install -e '.[serve]'") from None
    result = bench(args.target, args.workload, args.qps, args.seed, args.requests_per_task)
    print(f"{result['model']} at {args.target}: {result['requests']} requests, "
          f"{result['finished']} finished, attainment {result['attainment']:.3f}, "
          f"{result['seconds']:.1f} s")
    for key in ("ttft", "tpot", "e2e"):
        m = result[key]
        if m["mean"] is not None:
            print(f"  {key.upper():4s} s  mean {m['mean']:.4f}  p50 {m['p50']:.4f}  "
                  f"p90 {m['p90']:.4f}  p99 {m['p99']:.4f}")
    if result["errors"]:
        print("  errors: " + "; ".join(result["errors"]))
    if args.json:
        write_json(args.json, result)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hfx", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("sim", help="simulate one configuration",
                         description="Simulate one policy on one workload; print a summary.")
    sim.add_argument("--config", help="YAML file of options (flags override it)")
    sim.add_argument("--json", metavar="PATH", help="write the result object here")
    add_model_args(sim, SimConfig)
    sim.set_defaults(func=cmd_sim)

    sweep = sub.add_parser("sweep", help="simulate a grid of policies × QPS",
                           description="Run every policy at every QPS (in parallel processes), "
                           "print a table, write JSON and a PNG like HyperFlexis Figure 3.")
    sweep.add_argument("--config", help="YAML file of options (flags override it)")
    sweep.add_argument("--preset", help="a named experiment (hfx list shows them); sets the "
                       "workload, the series and the QPS grid")
    sweep.add_argument("--policies", type=_csv(str), default=["rr", "least-loaded"],
                       help="comma-separated policies (default: rr,least-loaded)")
    sweep.add_argument("--qps", type=_csv(float), default=None,
                       help="comma-separated total QPS values (default: 20,40,...,160, or the "
                       "preset's)")
    sweep.add_argument("--out", default="results", help="output folder (default: results)")
    sweep.add_argument("--name", help="file name stem (default: sweep-<workload>)")
    sweep.add_argument("--jobs", type=int, default=None,
                       help="parallel processes (default: one per core)")
    sweep.add_argument("--ray-address", metavar="ADDR", default=None,
                       help="run the points on a Ray cluster instead of local processes: "
                       "auto, ray://HOST:10001, or local (start one here); hfx must be "
                       "installed on its nodes")
    sweep.add_argument("--seeds", type=int, default=1,
                       help="workload seeds per point, from --seed on; tables show the mean "
                       "and attainment's std (default: 1)")
    add_model_args(sweep, SimConfig, exclude=("policy", "qps"))
    sweep.set_defaults(func=cmd_sweep)

    cap = sub.add_parser("capacity", help="the highest sustained QPS at a target attainment",
                         description="Bisect over steady-state runs (--duration, default 300 s "
                         "after a 60 s --warmup) for the highest QPS whose attainment meets "
                         "--target, per seed; print each seed's and the mean ± std. --qps is "
                         "where the search starts.")
    cap.add_argument("--config", help="YAML file of options (flags override it)")
    cap.add_argument("--json", metavar="PATH", help="write the result here")
    cap.add_argument("--target", type=float, default=0.9,
                     help="attainment the rate must keep (default: 0.9)")
    cap.add_argument("--seeds", type=int, default=3, help="workload seeds, from --seed on "
                     "(default: 3)")
    cap.add_argument("--tolerance", type=float, default=0.02,
                     help="stop when the bracket is this close, relative (default: 0.02)")
    cap.add_argument("--jobs", type=int, default=None,
                     help="parallel processes (default: one per core, at most one per seed)")
    cap.add_argument("--ray-address", metavar="ADDR", default=None,
                     help="run the seeds on a Ray cluster instead of local processes: auto, "
                     "ray://HOST:10001, or local (start one here)")
    add_model_args(cap, SimConfig)
    cap.set_defaults(func=cmd_capacity)

    what = sub.add_parser("whatif", help="replay a trace under every policy × fleet size",
                          description="Replay a trace (hfx serve --record's, HFX's own columns, "
                          "or Azure, BurstGPT, Mooncake: --trace-format) on the simulator under "
                          "every policy and fleet size; print attainment and cost, and the "
                          "smallest fleet meeting --target per policy.")
    what.add_argument("--trace", required=True, help="the trace file")
    what.add_argument("--config", help="YAML file of options (flags override it)")
    what.add_argument("--policies", type=_csv(str), default=["hfx", "rr"],
                      help="comma-separated policies (default: hfx,rr)")
    what.add_argument("--instances", type=_csv(int), default=[1, 2, 3, 4],
                      help="comma-separated fleet sizes (default: 1,2,3,4)")
    what.add_argument("--target", type=float, default=0.9,
                      help="attainment a fleet must reach (default: 0.9)")
    what.add_argument("--jobs", type=int, default=None,
                      help="parallel processes (default: one per core)")
    what.add_argument("--ray-address", metavar="ADDR", default=None,
                      help="run on a Ray cluster: auto, ray://HOST:10001, or local")
    what.add_argument("--json", metavar="PATH", help="write the result object here")
    what.add_argument("--plot", metavar="PNG", help="attainment and cost against fleet size")
    add_model_args(what, SimConfig, exclude=("policy", "instances", "workload", "qps"))
    what.set_defaults(func=cmd_whatif)

    prof = sub.add_parser("profile", help="measure the real engine and fit a step-time profile",
                          description="Time prefill and decode steps of the real executor on "
                          "HyperFlexis Appendix A's grid (or of a vLLM server: --engine vllm), "
                          "fit Eq. 1 and Eq. 2, write a profile JSON that hfx sim --profile "
                          "and hfx serve --profile accept.")
    prof.add_argument("--config", help="YAML file of options (flags override it)")
    add_model_args(prof, ProfileConfig)
    prof.set_defaults(func=cmd_profile)

    ckpt = sub.add_parser("checkpoint", help="write a random-weight checkpoint (+ tokenizer)",
                          description="Random weights of a model shape as a Hugging Face "
                          "checkpoint directory with a byte-level tokenizer.json: a model "
                          "vLLM can load (hfx serve --engine vllm --checkpoint DIR) where none "
                          "can be downloaded.")
    ckpt.add_argument("out", help="directory to write")
    ckpt.add_argument("--shape", default="tiny", help="model shape (default: tiny)")
    ckpt.add_argument("--weight-seed", type=int, default=0)
    ckpt.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ckpt.set_defaults(func=cmd_checkpoint)

    serve = sub.add_parser("serve", help="serve OpenAI-compatible HTTP with per-request SLOs",
                           description="An OpenAI-compatible gateway (/v1/completions, "
                           "/v1/chat/completions, /v1/models, /health, /metrics) in front of "
                           "instances of the real engine (or --executor sim).")
    serve.add_argument("--config", help="YAML file of options (flags override it)")
    add_model_args(serve, ServeConfig)
    serve.set_defaults(func=cmd_serve)

    bench = sub.add_parser("bench", help="drive a live server with a workload",
                           description="Send a workload (Poisson arrivals, Table 1 lengths and "
                           "SLOs) to a running hfx serve (or any OpenAI-compatible server that "
                           "accepts token-id prompts); write the result JSON of hfx sim.")
    bench.add_argument("--target", required=True, help="server URL, e.g. http://127.0.0.1:8000")
    bench.add_argument("--workload", default="four-task", help="task set or trace file")
    bench.add_argument("--qps", type=float, default=4.0, help="total requests/s")
    bench.add_argument("--requests-per-task", type=int, default=50)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json", metavar="PATH", help="write the result object here")
    bench.set_defaults(func=cmd_bench)

    lst = sub.add_parser("list", help="list policies, planners, workloads and profiles")
    lst.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
        return code
    except (ValueError, FileNotFoundError) as e:
        print(f"hfx: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`hfx list | head`): stop quietly, as Unix tools do, and keep
        # the interpreter's final flush from raising again (Python docs, "SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it


if __name__ == "__main__":
    sys.exit(main())
