"""One validated configuration per command, composed of sections (sections.py): ``ClusterConfig``
(what ``hfx.assembly.build_cluster`` needs), ``SimConfig``, ``ProfileConfig``, ``ServeConfig``."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, model_validator

from hfx.config.sections import (
    DEFAULT_STEP_NOISE,
    AdmissionSection,
    BackendSection,
    EngineSection,
    FleetSection,
    GatewaySection,
    ModelConfig,
    OutlierSection,
    PolicySection,
    ScalerSection,
    VLLMSection,
    WorkloadSection,
)
from hfx.policies import PD_POLICIES, POLICIES


class ClusterConfig(FleetSection, EngineSection, PolicySection, ScalerSection,
                    AdmissionSection):
    """Everything ``hfx.assembly.build_cluster`` needs; ``hfx sim`` and ``hfx serve`` share it."""

    @model_validator(mode="after")
    def _scaling_bounds(self) -> ClusterConfig:
        initial = self.initial_instances
        if self.max_instances is not None and self.max_instances < initial:
            raise ValueError(f"max_instances ({self.max_instances}) is below the initial "
                             f"fleet ({initial})")
        return self

    @model_validator(mode="after")
    def _known_policy(self) -> ClusterConfig:
        if self.mode == "pd":
            if self.policy not in PD_POLICIES and self.policy != "rr":
                raise ValueError(f"unknown P/D policy {self.policy!r}; choose one of "
                                 f"{', '.join(PD_POLICIES)}")
        elif self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of "
                             f"{', '.join(POLICIES)}")
        return self


class SimConfig(WorkloadSection, ClusterConfig):
    """One simulated run: a workload on a fleet under one policy."""

    model: str = Field("qwen2.5-7b", description="model of the shipped roofline profile "
                       "(qwen2.5-7b, qwen2.5-32b, llama-3-70b)")
    hardware: str = Field("ascend-910b", description="device of the shipped roofline profile "
                          "(ascend-910b, the seeds' NPU; h200)")
    profile: str | None = Field(None, description="step-time profile JSON; overrides "
                                "--model/--hardware")
    step_noise: float = Field(DEFAULT_STEP_NOISE, ge=0, allow_inf_nan=False, description=(
        "coefficient of variation of each simulated step's time around the profile's "
        "prediction (seeded by --seed); the policies still predict with the profile, so they "
        "are no oracle. 0: exact step times (measured on the real engine: bench/"
        "step_noise.py)"))
    token_delivery: float | None = Field(None, ge=0, allow_inf_nan=False, description=(
        "seconds from a simulated step to the control plane's record of its tokens (what a real "
        "server's front end, stream and loop add); default: the profile's "
        "meta.token_delivery_seconds, which hfx serve's live calibration fits and --record "
        "writes beside the trace, else 0"))
    fold_records: bool = Field(True, description=(
        "fold each finished request's record into the metrics' columns as the run goes and "
        "drop it (~100 B a request kept instead of every token time; colocated mode, where "
        "nothing reads a record after its end); --no-fold-records keeps them all, with "
        "identical results (the check of that)"))
    metrics: Literal["exact", "streaming"] = Field("exact", description=(
        "exact: every measured request's numbers kept to the end (~100 B a request); "
        "streaming: counters and latency sketches only, memory that does not grow with the "
        "run (percentiles within 0.5%, means to the last bits; counts and attainment exact: "
        "hfx/records/streaming.py), for runs of tens of millions of requests"))


class ProfileConfig(ModelConfig, BackendSection, VLLMSection):
    """``hfx profile``: measure the model on the seed's grid and fit the step-time model; with
    ``--engine vllm``, a vLLM server (``--backend URL``, or one started from --checkpoint)."""

    block_size: int = Field(16, ge=1, description="tokens per KV block (vLLM's default)")
    kv_tokens: int = Field(65536, ge=16, description="KV cache capacity per instance, tokens")
    quick: bool = Field(False, description="a grid a CPU runs in about a minute (prefill batches"
                        " ≤ 8, decode ≤ 64, lengths ≤ 1024); default: HyperFlexis Appendix A's")
    repeats: int | None = Field(None, ge=1, description="timed runs per point (median); default"
                                " 3")
    out: str = Field("profile.json", description="where to write the profile JSON")


class ServeConfig(ModelConfig, GatewaySection, BackendSection, VLLMSection, OutlierSection,
                  ClusterConfig):
    """``hfx serve``: an OpenAI-compatible gateway in front of a cluster of instances. The
    cluster sections are ``hfx sim``'s; the defaults below differ where serving needs it."""

    policy: str = Field("hfx", description=f"dispatch policy ({', '.join(POLICIES)}; in pd mode "
                        f"{', '.join(PD_POLICIES)})")
    instances: int = Field(1, ge=1, description="instances, colocated mode")
    prefill: int = Field(1, ge=1, description="prefill instances in pd mode")
    decode: int = Field(1, ge=1, description="decode instances in pd mode")
    kv_capacity_tokens: int = Field(65536, ge=16, description="KV cache capacity per instance, "
                                    "tokens")
    max_queued: int | None = Field(1024, ge=1, description="requests waiting at the "
                                   "dispatcher at most; an arrival beyond is shed (HTTP 429)")
    max_wait: float | None = Field(30.0, ge=0, allow_inf_nan=False, description=(
        "seconds a request may go past its TTFT SLO without a first token before it is shed "
        "(HTTP 503)"))
    fair_share: Literal["off", "class", "fleet"] = Field("class", description=(
        "share the fleet between tenants (x-tenant, API keys of --tenants): class: within "
        "each SLO class a tenant past its share waits behind the others; fleet: across "
        "classes too; off: arrival order (hfx/cluster/fair_share.py)"))
    priorities: int = Field(4, ge=1, le=4, description="priority levels HFX-PM maps (0 = most "
                            "important), from Table 1's four-task SLOs (HyperFlexis §7.3)")
    profile: str | None = Field(None, description="step-time profile for the dispatcher (and "
                                "the sim executor); default tiny@cpu for the tiny shape on CPU, "
                                "qwen2.5-7b@ascend-910b for --executor sim, else measured at "
                                "start (hfx profile --quick)")


    @property
    def num_api_workers(self) -> int:
        """auto: the cores this process may run on (its affinity and cgroup's cpuset, not the
        machine's count)."""
        if self.api_workers != "auto":
            return int(self.api_workers)
        if hasattr(os, "sched_getaffinity"):
            return max(1, len(os.sched_getaffinity(0)))
        return os.cpu_count() or 1

    @model_validator(mode="before")
    @classmethod
    def _one_instance_per_backend(cls, values: Any) -> Any:
        """Every --backend is served: colocated, the instance count follows them unless
        given (a second --backend was silently dropped)."""
        if (isinstance(values, dict) and values.get("mode", "colocated") == "colocated"
                and values.get("backend") and "instances" not in values):
            values = {**values, "instances": len(values["backend"])}
        return values

    @model_validator(mode="after")
    def _backends_fit(self) -> ServeConfig:
        if not self.backend:
            return self
        fleet = self.prefill + self.decode if self.mode == "pd" else self.instances
        if fleet < len(self.backend):
            what = ("--prefill + --decode" if self.mode == "pd" else "--instances")
            raise ValueError(f"{len(self.backend)} --backend URLs given but {what} is {fleet}; "
                             "every backend must serve (raise the count or drop a URL)")
        return self


