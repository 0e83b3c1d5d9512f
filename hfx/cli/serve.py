"""``hfx serve``: the OpenAI-compatible gateway, in one process or a tree of fronts."""

from __future__ import annotations

import argparse
import os
from typing import Any

from hfx.cli.common import config_of
from hfx.config import ServeConfig, add_model_args


def add_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="serve OpenAI-compatible HTTP with per-request SLOs",
                           description="An OpenAI-compatible gateway (/v1/completions, "
                           "/v1/chat/completions, /v1/models, /health, /metrics) in front of "
                           "instances of the real engine (or --executor sim).")
    serve.add_argument("--config", help="YAML file of options (flags override it)")
    add_model_args(serve, ServeConfig)
    serve.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    env_key = os.environ.get("HFX_API_KEY") or None  # as vLLM's VLLM_API_KEY
    config = config_of(ServeConfig, args, args.config)
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
    print(f"serving {server.options.model_name} on http://{config.host}:{config.port}/v1 "
          f"({server.fleet}, {config.policy} policy)")
    access = Access.of(config, server.options.tenant_keys)
    workers = config.num_api_workers
    if workers > 1:  # the control plane here, HTTP and streams in front processes
        from hfx.serving.tree import ProcessTree

        tree = ProcessTree(server, access, config.host, config.port, workers,
                           config.shutdown_timeout, config.upstream_idle_timeout,
                           tokens_at_front=server.streams_at_front,
                           front_timeout=config.front_timeout)
        print(f"{workers} front processes on port {tree.port}")
        code = tree.run()
        print("stopped")
        return code
    serve(server, access, config.host, config.port, config.shutdown_timeout)
    print("stopped")
    return 0
