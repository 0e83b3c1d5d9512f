"""Where instances run: one registration line per backend, chosen by ``--engine``.

``hfx`` is HFX's own engine core in this process or in Ray actors (``local.py``,
``ray/``: the simulated and the PyTorch executor); ``vllm`` is vLLM OpenAI servers, started or
attached (``vllm/``). A backend gives ``hfx serve`` its fleet (a ``Placement``), the dispatcher's
step-time profile and the model's limits, and ``hfx profile`` a measured profile
(``base.Backend``); the control plane sees only the ``Instance`` and ``Placement`` protocols
(hfx/cluster/). Adding one (SGLang, TensorRT-LLM) is a folder here and a line below.

The entries are import paths, resolved on first use: the configuration validates ``--engine``
against these names without importing any backend.
"""

from __future__ import annotations

from typing import Any

from hfx.registry import Registry

# Each entry a ``hfx.backends.base.Backend`` (not imported here: this module sits below the
# configuration, which reads the names).
BACKENDS: Registry[Any] = Registry("engine", {
    "hfx": "hfx.backends.own:OWN_ENGINE",
    "vllm": "hfx.backends.vllm.backend:VLLM",
})
