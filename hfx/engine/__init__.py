"""One inference instance: engine core, KV block manager, batch planners, executors.

The names below load on first use (PEP 562), so importing a light submodule (the planner
registry, the config) does not pull in the core and numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hfx.registry import lazy_exports

if TYPE_CHECKING:  # the lazy names' types: without them, mypy and mypyc see Any
    from hfx.engine.admission import Admission  # noqa: F401
    from hfx.engine.config import EngineConfig  # noqa: F401
    from hfx.engine.core import EngineCore, StepOutput  # noqa: F401
    from hfx.engine.errors import EngineError, StepFailed  # noqa: F401
    from hfx.engine.executor import Executor, SimExecutor  # noqa: F401
    from hfx.engine.sequence import FINISH_REASON, RequestStatus, Role, Sequence  # noqa: F401
    from hfx.engine.stats import InstanceStats  # noqa: F401

_EXPORTS = {
    "EngineConfig": "hfx.engine.config",
    "Admission": "hfx.engine.admission",
    "EngineCore": "hfx.engine.core",
    "EngineError": "hfx.engine.errors",
    "StepFailed": "hfx.engine.errors",
    "StepOutput": "hfx.engine.core",
    "Executor": "hfx.engine.executor",
    "SimExecutor": "hfx.engine.executor",
    "FINISH_REASON": "hfx.engine.sequence",
    "RequestStatus": "hfx.engine.sequence",
    "Role": "hfx.engine.sequence",
    "Sequence": "hfx.engine.sequence",
    "InstanceStats": "hfx.engine.stats",
}


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
