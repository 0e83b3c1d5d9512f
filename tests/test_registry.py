"""The plugin registries: every entry resolves to a class of that name, unknown names are a clear
error, and the CLI starts without importing the engine, the policies or numpy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hfx.engine.planners import PLANNERS
from hfx.policies import PD_POLICIES, POLICIES, make_pd_policies, make_policy
from hfx.registry import Registry, load


@pytest.mark.parametrize("registry", [POLICIES, PLANNERS], ids=["policies", "planners"])
def test_every_entry_is_the_class_of_its_name(registry: Registry) -> None:
    for name in registry:
        assert registry[name].name == name


def test_pd_stages_resolve() -> None:
    for name, (dispatcher, migrator) in PD_POLICIES.items():
        first, second = make_pd_policies(name)
        assert type(first) is load(dispatcher) and type(second) is load(migrator)


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown policy 'nope'; choose one of hfx, rr"):
        make_policy("nope")
    with pytest.raises(KeyError):
        POLICIES["nope"]
    assert "nope" not in POLICIES and "hfx" in POLICIES and len(POLICIES) == 13


def test_cli_start_imports_no_engine_policy_or_numpy() -> None:
    code = ("import sys, hfx.cli, hfx.config; "
            "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith("
            "('hfx.engine.core', 'hfx.policies.', 'hfx.engine.planners.', "
            "'hfx.stepmodel.latency'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hfx_list_into_a_closed_pipe_stops_quietly() -> None:
    # `hfx list | head -1` where head has already left: the CLI stops without a traceback,
    # with the shell's status for a tool whose pipe closed (128 + SIGPIPE).
    read, write = os.pipe()
    os.close(read)
    try:
        cli = subprocess.run([sys.executable, "-m", "hfx.cli", "list"], stdout=write,
                             stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    assert "Traceback" not in cli.stderr and "Exception ignored" not in cli.stderr, cli.stderr
    assert cli.returncode == 141
