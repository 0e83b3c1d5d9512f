"""``hfx profile``: the real engine's (or a vLLM server's) step times, fitted to a profile."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hfx.cli.common import config_of
from hfx.config import ProfileConfig, add_model_args

if TYPE_CHECKING:
    pass


def add_parser(sub: Any) -> None:
    prof = sub.add_parser("profile", help="measure the real engine and fit a step-time profile",
                          description="Time prefill and decode steps of the real executor on "
                          "HyperFlexis Appendix A's grid (or of a vLLM server: --engine vllm), "
                          "fit Eq. 1 and Eq. 2, write a profile JSON that hfx sim --profile "
                          "and hfx serve --profile accept.")
    prof.add_argument("--config", help="YAML file of options (flags override it)")
    add_model_args(prof, ProfileConfig)
    prof.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_of(ProfileConfig, args, args.config)
    if config.engine == "vllm":
        from hfx.backends.vllm.build import profile_server

        profile = profile_server(config)
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
