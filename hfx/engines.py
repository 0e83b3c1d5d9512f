"""The engines ``--engine`` chooses: one registration line per backend (hfx/backends/).

The entries are import paths, resolved on first use: the configuration validates ``--engine``
against these names without importing any backend (it sits below them; the backends read it).
"""

from __future__ import annotations

from typing import Any

from hfx.registry import Registry

# Each entry a ``hfx.backends.base.Backend``.
BACKENDS: Registry[Any] = Registry("engine", {
    "hfx": "hfx.backends.own:OWN_ENGINE",
    "vllm": "hfx.backends.vllm.backend:VLLM",
    "openai": "hfx.backends.openai.backend:OPENAI",
})
