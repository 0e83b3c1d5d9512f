"""What a backend gives ``hfx serve`` and ``hfx profile``; ``BACKENDS`` (hfx/engines.py)
names each by its ``--engine`` value."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hfx.cluster.control import ControlPlane
    from hfx.cluster.placement import EngineFactory, Placement
    from hfx.config import ProfileConfig, ServeConfig
    from hfx.model.tokenizer import Tokenizer
    from hfx.registry import Registry
    from hfx.stepmodel.latency import Profile


class Service(Protocol):
    """A background task of the serving process, started and stopped with it."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass
class Served:
    """A backend's fleet before the control plane is built over it, and what the gateway must
    know of its model."""

    config: ServeConfig  # the configuration to build with (a backend may fill in a field)
    model_name: str
    tokenizer: Tokenizer
    max_model_len: int
    vocab_size: int
    eos_token_id: int | None
    profile: Profile  # the dispatcher's step-time model
    engines: EngineFactory | None  # the engines LocalPlacement builds (None: ``placement`` does)
    placement: Placement | None  # None: engines on this process's loop
    placeholder_text: str | None = None  # a simulated executor's text per token
    # The planner that stands for the backend's engine (None: the configured or the policy's
    # own): the dispatcher predicts for it (ClusterView.mixed_steps), and live calibration
    # replays each instance's requests on it, with this token budget (None: the configured
    # one); no calibration unless ``calibrate``.
    calibrate: bool = True
    replay_planner: str | None = None
    replay_token_budget: int | None = None
    # After the control plane is built (a warm pool's weights), and if building it fails.
    prepare: Callable[[ControlPlane], None] = lambda control: None
    close: Callable[[], None] = lambda: None
    services: Callable[[ControlPlane], list[Service]] = field(default=lambda control: [])
    # What the data plane needs from it: with --api-workers N the fronts run each request's
    # token stream from the upstream server (hfx/backends/openai_stream.py) rather than
    # hearing tokens the deciding process's engines sampled.
    streams_at_front: bool = False
    fleet: str = ""  # the fleet in a few words, for the start-up line ("2 vLLM servers")


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the gateway needs of a model whose weights its servers load themselves: from the
    checkpoint directory's config.json and tokenizer."""

    tokenizer: Tokenizer
    max_model_len: int  # the configured one, within the model's own
    vocab_size: int
    eos_token_id: int | None


def served_model(checkpoint: str, max_model_len: int) -> ServedModel:
    from hfx.model.tokenizer import load_tokenizer

    hf = json.loads((Path(checkpoint) / "config.json").read_text())
    eos = hf.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    return ServedModel(load_tokenizer(checkpoint, eos),
                       min(max_model_len, int(hf.get("max_position_embeddings", 1 << 31))),
                       int(hf["vocab_size"]), eos)


class Backend(Protocol):
    """Where instances run, for ``hfx serve`` (``serve``) and ``hfx profile`` (``profile``).
    ``section`` names the configuration section of its own settings (hfx/config/sections.py;
    None: it reads only the shared ones): a setting of another backend's section is refused
    at start (``check_settings``), never silently ignored."""

    section: str | None

    def serve(self, config: ServeConfig) -> Served: ...

    def profile(self, config: ProfileConfig) -> Profile: ...


def check_settings(config: ServeConfig | ProfileConfig, backends: Registry[Backend]) -> None:
    """Refuse a setting given for another engine than ``config.engine`` (``--vllm-args``
    with ``--engine openai``): it would be ignored."""
    from hfx.config.flags import section_of

    own = backends[config.engine].section
    others: dict[str | None, str] = {b.section: name for name in backends
              if (b := backends[name]).section is not None and b.section != own}
    for name in sorted(config.model_fields_set):
        engine = others.get(section_of(type(config), name))
        if engine is not None:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} is a setting of --engine {engine}; this one runs "
                             f"--engine {config.engine}, which would ignore it")

