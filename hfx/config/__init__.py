"""Configuration: one validated pydantic model per command; its fields generate the CLI flags.

Each field carries its help text and its default; defaults are the papers' values where they give
one, cited beside the field. A YAML file (``--config``) supplies values that flags override. The
sections (sections.py) define each setting once; commands (commands.py) compose them; flags.py
turns fields into flags and back.
"""

from hfx.config.commands import ClusterConfig, ProfileConfig, ServeConfig, SimConfig
from hfx.config.flags import (
    add_model_args,
    flatten_sections,
    model_from_args,
    parse_params,
    section_of,
)
from hfx.config.sections import (
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_STEP_NOISE,
    SECTIONS,
    AdmissionSection,
    BackendSection,
    EngineSection,
    FleetSection,
    GatewaySection,
    ModelConfig,
    OutlierSection,
    PolicySection,
    ScalerSection,
    Section,
    VLLMSection,
    WorkloadSection,
)

__all__ = [
    "DEFAULT_DRAIN_SECONDS", "DEFAULT_STEP_NOISE", "SECTIONS", "AdmissionSection",
    "BackendSection", "ClusterConfig", "EngineSection", "FleetSection", "GatewaySection",
    "ModelConfig", "OutlierSection", "PolicySection", "ProfileConfig", "ScalerSection", "Section",
    "ServeConfig", "SimConfig", "VLLMSection", "WorkloadSection", "add_model_args",
    "flatten_sections", "model_from_args", "parse_params", "section_of",
]
