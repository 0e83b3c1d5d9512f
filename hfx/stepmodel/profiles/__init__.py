"""The shipped step-time profiles, ``<model>@<hardware>.json`` (hfx/stepmodel/latency.py loads
them)."""

from __future__ import annotations

from importlib import resources


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped here (``<model>@<hardware>``)."""
    files = resources.files(__name__).iterdir()
    return sorted(f.name.removesuffix(".json") for f in files if f.name.endswith(".json"))
