"""One inference instance: engine core, KV block manager, batch planners, executors."""

from hfx.engine.config import EngineConfig
from hfx.engine.core import Admission, EngineCore, EngineError, StepFailed, StepOutput
from hfx.engine.executor import Executor, SimExecutor
from hfx.engine.sequence import FINISH_REASON, RequestStatus, Role, Sequence
from hfx.engine.stats import InstanceStats

__all__ = [
    "FINISH_REASON",
    "Admission",
    "EngineConfig",
    "EngineCore",
    "EngineError",
    "Executor",
    "InstanceStats",
    "RequestStatus",
    "Role",
    "Sequence",
    "SimExecutor",
    "StepFailed",
    "StepOutput",
]
