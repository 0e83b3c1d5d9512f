"""HFX: multi-SLO LLM serving, simulated at cluster scale and served for real.

``HFX_NATIVE=1`` loads the simulator's hot modules as compiled by ``hfx native build``
(hfx/native.py): a process-wide choice of build, like ``PYTHONOPTIMIZE``, made here because it
must come before any of them is imported.
"""

import os as _os

# hfx.native.requested(), inline: a plain start does not import hfx.native.
if _os.environ.get("HFX_NATIVE", "") not in ("", "0"):
    from hfx import native as _native

    _native.activate_from_env()
