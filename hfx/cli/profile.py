"""``hfx profile``: the real engine's (or a vLLM server's) step times, fitted to a profile."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hfx.cli.common import config_of
from hfx.config import ProfileConfig, add_model_args


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
    from hfx.backends.base import Backend, check_settings
    from hfx.engines import BACKENDS

    config = config_of(ProfileConfig, args, args.config)
    backend: Backend = BACKENDS.get_or_raise(config.engine)
    check_settings(config, BACKENDS)
    profile = backend.profile(config)
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
