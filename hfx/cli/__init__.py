"""The ``hfx`` command line, a module per command: ``hfx sim``, ``sweep``, ``capacity``,
``whatif``, ``profile``, ``checkpoint``, ``serve``, ``bench``, ``list``, ``native``.

Flags are generated from the fields of the command's configuration (hfx/config/), so each flag
carries the field's help text and default; ``--config FILE.yaml`` sets any of them from a file.
Each command module imports what it runs only when it runs, so that ``hfx list`` and ``--help``
stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys

from hfx.cli import (
    bench,
    capacity,
    checkpoint,
    listing,
    native,
    profile,
    serve,
    sim,
    sweep,
    whatif,
)

# In the order ``hfx --help`` lists them.
COMMANDS = (sim, sweep, capacity, whatif, profile, checkpoint, serve, bench, listing, native)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hfx", description="The hfx command line.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
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
