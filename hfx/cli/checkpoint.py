"""``hfx checkpoint``: a random-weight checkpoint and its tokenizer."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    ckpt = sub.add_parser("checkpoint", help="write a random-weight checkpoint (+ tokenizer)",
                          description="Random weights of a model shape as a Hugging Face "
                          "checkpoint directory with a byte-level tokenizer.json: a model "
                          "vLLM can load (hfx serve --engine vllm --checkpoint DIR) where none "
                          "can be downloaded.")
    ckpt.add_argument("out", help="directory to write")
    ckpt.add_argument("--shape", default="tiny", help="model shape (default: tiny)")
    ckpt.add_argument("--weight-seed", type=int, default=0)
    ckpt.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ckpt.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from hfx.model.build import write_random_checkpoint
    except ImportError as e:
        raise ValueError(f"hfx checkpoint needs the torch extra ({e}): pip install "
                         "torch==2.13.0 && pip install -e '.[torch]'") from None
    path = write_random_checkpoint(args.shape, args.out, args.weight_seed, args.dtype)
    print(f"wrote {args.shape} random weights and the byte tokenizer to {path}")
    return 0
