"""Configuration: one validated pydantic model per command; its fields generate the CLI flags.

Each field carries its help text and its default; defaults are the seeds' values where the seeds
give one, cited beside the field. A YAML file (``--config``) supplies values that flags override.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hfx.engine.planners import PLANNERS
from hfx.policies import PD_POLICIES, POLICIES
from hfx.workloads.tasks import BURSTY, DEFAULT_REQUESTS_PER_TASK, TIERED, WORKLOADS

DEFAULT_DRAIN_SECONDS = 60.0  # a steady-state run's bound on the drain
# The real engine's median step-time CV between repeats, qwen2.5-0.5b on CPU
# (bench/step_noise.py, docs/results/step_noise.json).
DEFAULT_STEP_NOISE = 0.1


class Section(BaseModel):
    """One section of the configuration. Commands compose the sections they need, so each
    setting has one definition, one default and one flag wherever it applies; a YAML file may
    give a section's settings flat or under its name (``scaler: {max_instances: 4}``)."""

    # defer_build: schemas are built on first validation, not at CLI start.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    section: ClassVar[str]


class FleetSection(Section):
    """Which instances serve, in which roles, and how the control plane watches them."""

    section: ClassVar[str] = "fleet"

    instances: int = Field(2, ge=1, description="number of instances, colocated mode (HyperFlexis "
                           "§8.1: 2)")
    mode: Literal["colocated", "pd"] = Field("colocated", description="colocated, or pd: "
                                             "prefill and decode on separate instances")
    prefill: int = Field(2, ge=1,
                         description="prefill instances in pd mode (HyperFlexis §8.1.2: 2)")
    decode: int = Field(2, ge=1, description="decode instances in pd mode (HyperFlexis §8.1.2: 2)")
    devices_per_node: int = Field(8, ge=1, description="devices per server, for KV links "
                                  "(HyperFlexis §7.1: 8 NPUs)")
    intra_node_gbps: float = Field(720.0, gt=0, description="KV link bandwidth within a node, "
                                   "Gb/s (HFX paper §4.1: HCCS 720)")
    inter_node_gbps: float = Field(200.0, gt=0, description="KV link bandwidth across nodes, "
                                   "Gb/s (HFX paper §4.1: 200 GbE RoCE)")
    link_latency: float = Field(0.5e-3, ge=0, description="fixed cost of one KV transfer, s")
    kv_bytes_per_token: int | None = Field(None, ge=1, description="KV bytes per token; default:"
                                           " from the profile's model config")
    monitor_interval: float = Field(1.0, gt=0, description="Monitor snapshot interval, s "
                                    "(HyperFlexis §9.3: 1 s)")

    @property
    def initial_instances(self) -> int:
        return self.prefill + self.decode if self.mode == "pd" else self.instances


class EngineSection(Section):
    """Each instance's engine: batch planner, sequence and token limits, KV cache."""

    section: ClassVar[str] = "engine"

    planner: str | None = Field(None, description=f"engine batch planner ({', '.join(PLANNERS)});"
                                " default: the policy's own")
    planner_params: dict[str, float] = Field(default_factory=dict, description=(
        "planner tunables as key=value,... (slack_share for deadline-chunked, pace for "
        "slo-paced); default: each planner's own"))
    max_num_seqs: int = Field(256, ge=1, description="running sequences per instance at most")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="tokens per step at most;"
                                               " default: the planner's own")
    block_size: int = Field(16, ge=1, description="KV block size in tokens")
    kv_capacity_tokens: int | None = Field(None, ge=1, description="KV capacity per instance in "
                                           "tokens; default: from the profile's memory")

    @field_validator("planner")
    @classmethod
    def _known_planner(cls, v: str | None) -> str | None:
        if v is not None and v not in PLANNERS:
            raise ValueError(f"unknown planner {v!r}; choose one of {', '.join(PLANNERS)}")
        return v


class PolicySection(Section):
    """The dispatch policy, its parameters and predictions, and priority mapping."""

    section: ClassVar[str] = "policy"

    policy: str = Field("rr", description=f"dispatch policy ({', '.join(POLICIES)}; in pd mode "
                        f"{', '.join(PD_POLICIES)})")
    policy_params: dict[str, float | str] = Field(default_factory=dict, description=(
        "policy parameters as key=value,... (e.g. theta=0.6 for hfx)"))
    predictor_error: float = Field(0.0, gt=-1, description="the dispatcher's step-time "
                                   "predictions are scaled by (1 + this); 0.2 = 20% too slow")
    priorities: int | None = Field(None, ge=1, description=(
        "give each task a priority instead of its SLO (0 = most important, by TTFT SLO) and map "
        "priorities to SLOs with HFX-PM (HyperFlexis §5.2); N levels"))
    priority_window: int = Field(200, ge=1, description="HFX-PM sliding window, completed "
                                 "requests (the seed gives no value)")


class ScalerSection(Section):
    """The Scaler (HyperFlexis §6, Algorithm 3) and how new instances get their weights."""

    section: ClassVar[str] = "scaler"

    max_instances: int | None = Field(None, ge=1, description=(
        "turn the Scaler on, up to this many instances (in pd mode both pools together; seed "
        "000 §8: 2 → 4 colocated, 4 → 8 P/D)"))
    scaling_interval: float = Field(1.0, gt=0, description="Scaler period τ, s (HyperFlexis §9.3)")
    scale_out_ratio: float = Field(1.1, gt=0, description="ε_o: scale out when R_in/R_out "
                                   "exceeds it (the seed's value was lost; ours)")
    scale_in_ratio: float = Field(0.9, gt=0, description="ε_i: scale in below it (ours)")
    wait_threshold: float = Field(0.5, gt=0, description="scale out when queued requests have "
                                  "waited this fraction of their SLO on average (ours)")
    wait_indicator: Literal["per-class", "mean"] = Field("per-class", description=(
        "W, the Scaler's wait signal: the mean over the queue of wait / SLO per SLO class, the "
        "largest (ours), or over the whole queue (mean: HFX paper §3.3.3), where loose requests "
        "can hide a tight class that misses"))
    scaling_cooldown: float = Field(2.0, ge=0, description="seconds between scaling actions")
    weight_path: Literal["d2d", "cpu", "disk"] = Field("d2d", description="how a new instance "
                                                       "gets its weights (HyperFlexis §6, Table 2)")
    warm_pool: int | None = Field(None, ge=0, description="warm instances (runtime up, no "
                                  "weights); default: the free devices, max - initial")
    cold_start: float = Field(20.0, ge=0, description="runtime start without a warm instance, s")
    d2d_failure_rate: float = Field(0.0, ge=0, le=1, description="chance a D2D copy fails and "
                                    "falls back to disk")
    load_profile: str | None = Field(None, description="measured load seconds per weight path "
                                     "(JSON), replacing the model")


class AdmissionSection(Section):
    """Admission control: when the fleet sheds load instead of queueing it (hfx/cluster/
    admission.py); the same rule in simulation and serving."""

    section: ClassVar[str] = "admission"

    max_queued: int | None = Field(None, ge=1, description="requests waiting at the "
                                   "dispatcher at most; an arrival beyond is shed (HTTP 429); "
                                   "default: no bound")
    max_wait: float | None = Field(None, ge=0, allow_inf_nan=False, description=(
        "seconds a request may go past its TTFT SLO without a first token before it is shed "
        "(HTTP 503); default: no bound (the seeds' behaviour)"))


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


class WorkloadSection(Section):
    """What arrives: a task set at a rate, or a trace file."""

    section: ClassVar[str] = "workload"

    workload: str = Field("four-task", description=(
        f"task set ({', '.join(WORKLOADS)}), ramp (the priority ramp of HyperFlexis §9.1; qps is "
        f"per client), {', '.join(TIERED)} (PolyServe's setting, PolyServe §5.1; 4 × "
        f"requests-per-task requests), {', '.join(BURSTY)} (30 s at half the rate, 10 s at "
        "2.5×), or a trace file (.jsonl/.csv)"))
    qps: float = Field(4.0, gt=0, description="total arrival rate, requests/s, split equally "
                       "between the tasks (HyperFlexis §7.3); ignored for trace files")
    seed: int = Field(0, ge=0, description="random seed of the workload")
    requests_per_task: int = Field(DEFAULT_REQUESTS_PER_TASK, ge=1,
                                   description="requests drawn per task (HyperFlexis §7.3: 300)")
    duration: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "a steady-state run: Poisson arrivals at --qps for this many seconds, instead of "
        "--requests-per-task per task (which then drain, flattering every policy)"))
    warmup: float = Field(0.0, ge=0, allow_inf_nan=False, description=(
        "seconds at the start whose arrivals are left out of the metrics (with --duration)"))
    drain: float | None = Field(None, ge=0, allow_inf_nan=False, description=(
        "seconds after the arrivals end to let requests finish; any still unfinished then count"
        " as missed (backlog_at_end); default: 60 with --duration, else until all end"))

    trace_format: str = Field("auto", description=(
        "a trace file's format: auto (from its extension and columns), hfx (the columns "
        "above), hfx-record (hfx serve --record), azure (Azure LLM inference traces), burstgpt, "
        "mooncake"))
    slo_map: str | None = Field(None, description=(
        "SLOs for trace rows that carry none, milliseconds: 'default=2000:500,GPT-4=1000:100,"
        "input<=512=800:80' (a task name, then length classes in order, then default)"))
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False, description=(
        "replay a trace this many times faster (its arrivals divided by it)"))
    trace_qps: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "replay a trace at this mean rate, requests/s (its arrivals rescaled; instead of "
        "--time-scale)"))

    @field_validator("slo_map")
    @classmethod
    def _slo_map_parses(cls, v: str | None) -> str | None:
        if v is not None:
            from hfx.workloads.traces import parse_slo_map

            parse_slo_map(v)  # ValueError with the reason
        return v

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, v: str) -> str:
        if v not in WORKLOADS and v not in ("ramp", *TIERED, *BURSTY) and \
                not v.endswith((".jsonl", ".csv")):
            raise ValueError(f"unknown workload {v!r}; choose one of {', '.join(WORKLOADS)}, "
                             f"ramp, {', '.join((*TIERED, *BURSTY))}, or give a trace file "
                             "(.jsonl, .csv)")
        return v

    @model_validator(mode="after")
    def _steady_state(self) -> WorkloadSection:
        if self.duration is None:
            if self.warmup:
                raise ValueError("--warmup needs --duration (a steady-state run)")
            return self
        if self.workload == "ramp" or self.workload.endswith((".jsonl", ".csv")):
            raise ValueError("--duration applies to task sets; a trace or the ramp sets its "
                             "own arrivals")
        if self.warmup >= self.duration:
            raise ValueError(f"--warmup ({self.warmup:g} s) must be shorter than --duration "
                             f"({self.duration:g} s)")
        return self

    @property
    def drain_seconds(self) -> float | None:
        """How long after the arrivals end the run goes on; None: until every request ends."""
        if self.drain is not None:
            return self.drain
        return DEFAULT_DRAIN_SECONDS if self.duration is not None else None


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


class ModelConfig(Section):
    """The real model an executor runs: a checkpoint directory, or random weights of a shape."""

    section: ClassVar[str] = "model"

    shape: str = Field("tiny", description="random-weight model shape (tiny, qwen2.5-0.5b, "
                       "qwen2.5-7b); ignored with --checkpoint")
    checkpoint: str | None = Field(None, description="Hugging Face checkpoint directory "
                                   "(config.json + *.safetensors [+ tokenizer.json]); local only")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="weight and KV dtype; default bfloat16 on a GPU, float32 on CPU")
    device: str | None = Field(None, description="torch device; default cuda when present, "
                               "else cpu")
    weight_seed: int = Field(0, ge=0, description="seed of the random weights")


class VLLMSection(Section):
    """Real vLLM engines as the instances: HFX dispatches, vLLM runs the batches."""

    section: ClassVar[str] = "vllm"

    engine: Literal["hfx", "vllm"] = Field("hfx", description="hfx: HFX's own engine core "
                                           "(--executor); vllm: vLLM OpenAI servers, started "
                                           "from --checkpoint or given by --backend")
    backend: list[str] = Field(default_factory=list, description="URL of a running vLLM "
                               "server to dispatch to (repeatable; started with "
                               "--scheduling-policy priority); --instances beyond these are "
                               "started from --checkpoint")
    vllm_python: str | None = Field(None, description="Python interpreter with vLLM installed"
                                    ", for the servers HFX starts; default: this one")
    vllm_args: str = Field("", description="extra arguments for every vLLM server HFX starts, "
                           "e.g. '--enforce-eager --dtype float32'")
    vllm_startup_timeout: float = Field(600.0, gt=0, description="seconds a vLLM server may "
                                        "take to start")
    upstream_idle_timeout: float = Field(120.0, gt=0, allow_inf_nan=False, description=(
        "seconds a vLLM stream may be silent before it counts as broken: the request resumes "
        "elsewhere and the server is health-checked"))
    backend_check_interval: float = Field(5.0, gt=0, allow_inf_nan=False, description=(
        "seconds between health checks of --backend servers that left the fleet; one that "
        "answers again is re-admitted"))
    vllm_kv_transfer_config: str | None = Field(None, description="pd mode: vLLM's "
                                                "--kv-transfer-config JSON for every server; "
                                                "default: ExampleConnector over a temporary "
                                                "directory (one machine)")


class ProfileConfig(ModelConfig, VLLMSection):
    """``hfx profile``: measure the model on the seed's grid and fit the step-time model; with
    ``--engine vllm``, a vLLM server (``--backend URL``, or one started from --checkpoint)."""

    block_size: int = Field(16, ge=1, description="tokens per KV block (vLLM's default)")
    kv_tokens: int = Field(65536, ge=16, description="KV cache capacity per instance, tokens")
    quick: bool = Field(False, description="a grid a CPU runs in about a minute (prefill batches"
                        " ≤ 8, decode ≤ 64, lengths ≤ 1024); default: HyperFlexis Appendix A's")
    repeats: int | None = Field(None, ge=1, description="timed runs per point (median); default"
                                " 3")
    out: str = Field("profile.json", description="where to write the profile JSON")


class GatewaySection(Section):
    """The HTTP gateway, and where its instances run."""

    section: ClassVar[str] = "gateway"

    host: str = Field("127.0.0.1", description="address to listen on")
    served_model_name: str | None = Field(None, description="the model id clients send and "
                                          "/v1/models lists; default: the checkpoint folder's "
                                          "name, SHAPE-random, or PROFILE-sim")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0: any free one)")
    executor: Literal["torch", "sim"] = Field("torch", description="torch: the real model; "
                                              "sim: placeholder text at the profile's speed")
    default_ttft_ms: float = Field(2000.0, gt=0, description="SLO of a request that names none"
                                   " (Table 1's sharegpt: 2 s)")
    default_tpot_ms: float = Field(500.0, gt=0, description="SLO of a request that names none "
                                   "(Table 1's sharegpt: 0.5 s)")
    max_model_len: int = Field(4096, ge=16, description="prompt + output tokens per request "
                               "(capped by the model's positions)")
    ray: bool = Field(False, description="run every instance as a Ray actor (with --engine "
                      "vllm, each vLLM server a child of one); a local Ray instance unless "
                      "--ray-address")
    ray_address: str | None = Field(None, description="address of a Ray cluster to place "
                                    "instances on (implies --ray), e.g. auto or ray://host:10001")
    ray_cpus_per_instance: float = Field(1.0, ge=0, description="CPUs Ray reserves for each "
                                         "instance actor (a GPU too with --device cuda)")
    api_key: str | None = Field(None, description="require this key as a Bearer token on /v1/* "
                                "(as vLLM's --api-key); default: $HFX_API_KEY if set, else open")
    auth_metrics: bool = Field(False, description="require the API key on /metrics too")
    auth_health: bool = Field(False, description="require the API key on /health and /ready")
    cors_origins: str | None = Field(None, description="comma-separated origins browsers may "
                                     "call from (CORS); default: none")
    max_body_bytes: int = Field(8 << 20, ge=1024, description="largest request body; a larger "
                                "one is a 413 before it is read whole (default 8 MiB)")
    calibrate_every: float = Field(60.0, ge=0, allow_inf_nan=False, description=(
        "real engines: every this many seconds, refit the dispatcher's decode-step scale on "
        "the requests served since (a replay of each instance's requests on the simulator; "
        "hfx/serving/calibrator.py); 0: plan with the profile as measured"))
    calibrate_window: int = Field(400, ge=40, description="served requests a calibration "
                                  "fits on at most (the latest)")
    record: str | None = Field(None, description=(
        "write one JSONL row per request served to this file (rotated by size), and the "
        "dispatcher's step-time profile beside it, for hfx sim / hfx whatif to replay"))
    record_prompts: bool = Field(False, description="--record: add each prompt's token ids")
    record_max_mb: float = Field(100.0, gt=0, description="--record: rotate the file past "
                                 "this many MiB (5 older files kept)")
    stream_interval: int = Field(1, ge=1, description=(
        "tokens per streamed chunk (vLLM's --stream-interval): more than 1 coalesces a "
        "stream's tokens into fewer, multi-token chunks, for clients that accept them"))
    api_workers: str = Field("1", pattern=r"^(auto|[1-9][0-9]*)$", description=(
        "front processes that carry HTTP, tokenization, SSE and the streams from vLLM servers, "
        "sharing the port; the control plane decides in one process beside them. 1: "
        "everything in one process; auto: one per core"))
    shutdown_timeout: float = Field(30.0, ge=0, description="on SIGTERM/SIGINT, seconds to let "
                                    "in-flight requests finish (new ones get 503); a second "
                                    "signal exits at once")


class ServeConfig(ModelConfig, GatewaySection, VLLMSection, ClusterConfig):
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
        if (isinstance(values, dict) and values.get("engine") == "vllm"
                and values.get("mode", "colocated") == "colocated"
                and values.get("backend") and "instances" not in values):
            values = {**values, "instances": len(values["backend"])}
        return values

    @model_validator(mode="after")
    def _backends_fit(self) -> ServeConfig:
        if self.engine != "vllm" or not self.backend:
            return self
        fleet = self.prefill + self.decode if self.mode == "pd" else self.instances
        if fleet < len(self.backend):
            what = ("--prefill + --decode" if self.mode == "pd" else "--instances")
            raise ValueError(f"{len(self.backend)} --backend URLs given but {what} is {fleet}; "
                             "every backend must serve (raise the count or drop a URL)")
        return self


SECTIONS: dict[str, type[Section]] = {s.section: s for s in (
    WorkloadSection, FleetSection, EngineSection, PolicySection, ScalerSection,
    AdmissionSection, ModelConfig, GatewaySection, VLLMSection)}


# ---- CLI generation --------------------------------------------------------------------------
def parse_params(text: str) -> dict[str, float | str]:
    """``a=1,b=x`` → {"a": 1.0, "b": "x"}: numbers where they parse, strings otherwise."""
    out: dict[str, float | str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected key=value, got {item!r}")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            out[key.strip()] = value.strip()
    return out


def _scalar_type(annotation: Any) -> type:
    """int | None → int; str → str."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def section_of(schema: type[BaseModel], name: str) -> str | None:
    """The section that defines field ``name`` of ``schema`` (None: the command's own field)."""
    for cls in reversed(schema.__mro__):
        if (isinstance(cls, type) and issubclass(cls, Section) and "section" in vars(cls)
                and name in vars(cls).get("__annotations__", {})):
            return cls.section
    return None


def add_model_args(parser: argparse.ArgumentParser, model: type[BaseModel],
                   exclude: tuple[str, ...] = ()) -> None:
    """One ``--flag`` per field, with the field's description and default as help, grouped by
    the section that defines it."""
    groups: dict[str | None, argparse._ArgumentGroup] = {}
    fields = [(section_of(model, n), n, f) for n, f in model.model_fields.items()
              if n not in exclude]
    order = [None, *SECTIONS]
    for section, name, field in sorted(fields, key=lambda x: order.index(x[0])):
        if section not in groups:
            title = f"{model.__name__} options" if section is None else f"{section} options"
            doc = None if section is None else SECTIONS[section].__doc__
            groups[section] = parser.add_argument_group(title, doc)
        group = groups[section]
        kind = _scalar_type(field.annotation)
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} (default: {field.default})".replace("%", "%%")
        if typing.get_origin(kind) is Literal:
            group.add_argument(flag, choices=typing.get_args(kind), default=argparse.SUPPRESS,
                               dest=name, help=help_text)
        elif typing.get_origin(kind) is list:
            group.add_argument(flag, action="append", default=argparse.SUPPRESS, dest=name,
                               metavar="VALUE", help=f"{field.description} (repeatable)")
        elif typing.get_origin(kind) is dict:
            group.add_argument(flag, type=parse_params, default=argparse.SUPPRESS, dest=name,
                               metavar="K=V,...", help=help_text)
        elif kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
        else:
            group.add_argument(flag, type=kind, default=argparse.SUPPRESS, dest=name,
                               metavar=kind.__name__.upper(), help=help_text)


def flatten_sections(data: dict[str, Any], where: str) -> dict[str, Any]:
    """YAML settings given flat or under their section's name, as one flat mapping."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        key = key.replace("-", "_")
        if key in SECTIONS and isinstance(value, dict):
            for k, v in value.items():
                k = k.replace("-", "_")
                if k not in SECTIONS[key].model_fields:
                    raise SystemExit(f"{where}: {key}: unknown setting {k!r}; the {key} section "
                                     f"has {', '.join(SECTIONS[key].model_fields)}")
                flat[k] = v
        else:
            flat[key] = value
    return flat


def model_from_args(schema: type[BaseModel], args: argparse.Namespace,
                    config_file: str | Path | None = None, /, **overrides: Any) -> BaseModel:
    """Field values from the YAML file, then from the flags given, then ``overrides``.

    Raises SystemExit with the validation messages on bad values.
    """
    values: dict[str, Any] = {}
    if config_file:
        data = yaml.safe_load(Path(config_file).read_text()) or {}
        if not isinstance(data, dict):
            raise SystemExit(f"{config_file}: expected a mapping of option: value")
        values.update(flatten_sections(data, str(config_file)))
    values.update({k: v for k, v in vars(args).items() if k in schema.model_fields})
    values.update(overrides)
    try:
        return schema(**values)
    except ValidationError as e:
        lines = [(f"  --{'.'.join(map(str, err['loc'])).replace('_', '-')}: " if err["loc"]
                  else "  ") + err["msg"].removeprefix("Value error, ") for err in e.errors()]
        raise SystemExit("invalid configuration:\n" + "\n".join(lines)) from None
