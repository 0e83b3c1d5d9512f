"""The configuration's sections: each setting defined once, with its help text and default
(the papers' values where they give one, cited beside the field). Commands (commands.py)
compose the sections they need."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hfx.engine.planners import PLANNERS
from hfx.engines import BACKENDS
from hfx.policies import PD_POLICIES, POLICIES
from hfx.workloads.kinds import describe as describe_workloads
from hfx.workloads.kinds import kind_of
from hfx.workloads.tasks import DEFAULT_REQUESTS_PER_TASK, DEFAULT_SLO

DEFAULT_DRAIN_SECONDS = 60.0  # a steady-state run's bound on the drain
# The real engine's median step-time CV between repeats, qwen2.5-0.5b on CPU
# (bench/engine/step_noise.py, docs/results/step_noise.json).
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
    engine_runs: bool = Field(True, description=(
        "advance the decodes of an engine by one counter per step where its planner decodes "
        "every running sequence (hfx/engine/cohort.py); --no-engine-runs steps each sequence, "
        "with identical results (the check of that)"))
    prefix_caching: bool = Field(True, description=(
        "share full KV blocks of equal content between requests and keep them after, evicting "
        "the least recently used (hfx/engine/prefix_cache.py; vLLM v1's default, on); "
        "requests carry their content's block hashes (Mooncake's hash_ids, the session "
        "workloads) or token ids"))

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
    fair_share: Literal["off", "class", "fleet"] = Field("off", description=(
        "share the fleet between tenants (start-time fair queueing at VTC's token costs; "
        "hfx/cluster/fair_share.py): class: within each SLO class (and priority band), a "
        "tenant past its share waits behind the others; fleet: across classes too (a tenant "
        "within its share is served first whatever its class: the strictest protection, at "
        "the cost of throughput under a flood: docs/results.md 'Faults and floods')"))
    fair_reserve: int = Field(1, ge=0, description=(
        "with fair shares, sequences per instance a tenant running its share of the fleet's "
        "sequences or more may not take while another tenant is active: kept so a "
        "calm tenant's request starts at the next step rather than after a flood's batch "
        "(hfx/cluster/fair_share.py); 0: none kept"))
    tenants: str | None = Field(None, description=(
        "YAML or JSON file of tenants: {name: {weight, requests_per_second, "
        "tokens_per_minute, api_keys}}; weights shape fair shares, limits answer 429, keys "
        "name the tenant of a request (hfx/cluster/tenants.py, hfx/serving/tenancy.py)"))


class OutlierSection(Section):
    """Outlier ejection of serving instances whose streams keep breaking (hfx/cluster/
    outliers.py; Envoy's outlier detection and its defaults)."""

    section: ClassVar[str] = "outliers"

    eject_after: int = Field(5, ge=0, description="broken streams in a row that take an "
                             "instance out of dispatch for a while (its running streams go "
                             "on); 0: never")
    eject_seconds: float = Field(30.0, gt=0, allow_inf_nan=False, description=(
        "the first ejection's length; each further one is longer by as much"))
    eject_max_seconds: float = Field(300.0, gt=0, allow_inf_nan=False, description=(
        "the longest ejection"))
    eject_max_share: float = Field(0.1, ge=0, le=1, description=(
        "share of a pool's instances ejected at once at most (one always may be, never the "
        "last one taking work)"))

    @model_validator(mode="after")
    def _ordered(self) -> OutlierSection:
        if self.eject_max_seconds < self.eject_seconds:
            raise ValueError(f"--eject-max-seconds ({self.eject_max_seconds:g}) is below "
                             f"--eject-seconds ({self.eject_seconds:g})")
        return self


class WorkloadSection(Section):
    """What arrives: a task set at a rate, or a trace file."""

    section: ClassVar[str] = "workload"

    workload: str = Field("four-task", description=describe_workloads())
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
        "input<=512=800:80' (a task name, then length classes in order, then default); a row "
        "with none left gets hfx serve's default SLO (2000:500), and a warning says so"))
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
        kind_of(v)  # ValueError naming what would do
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


class BackendSection(Section):
    """Which backend runs the instances (hfx/engines.py names them; each is a folder under
    hfx/backends/ with its own section here)."""

    section: ClassVar[str] = "backend"

    engine: str = Field("hfx", description=f"where instances run ({', '.join(BACKENDS)}): "
                        "hfx: HFX's own engine core (--executor); vllm: vLLM OpenAI servers, "
                        "started from --checkpoint or given by --backend; openai: any "
                        "OpenAI-compatible servers given by --backend")
    # The servers of the backends that talk to servers (vllm, openai).
    backend: list[str] = Field(default_factory=list, description=(
        "URL of a running server to dispatch to (repeatable): a vLLM server (best started "
        "with --scheduling-policy priority; --instances beyond these are started from "
        "--checkpoint), or with --engine openai any OpenAI-compatible server"))
    upstream_idle_timeout: float = Field(120.0, gt=0, allow_inf_nan=False, description=(
        "seconds a server's stream may be silent before it counts as broken: the request "
        "resumes elsewhere and the server is health-checked"))
    backend_check_interval: float = Field(5.0, gt=0, allow_inf_nan=False, description=(
        "seconds between health checks of --backend servers that left the fleet; one that "
        "answers again is re-admitted"))

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"unknown engine {v!r}; choose one of {', '.join(BACKENDS)}")
        return v


class VLLMSection(Section):
    """Real vLLM engines as the instances: HFX dispatches, vLLM runs the batches."""

    section: ClassVar[str] = "vllm"

    vllm_python: str | None = Field(None, description="Python interpreter with vLLM installed"
                                    ", for the servers HFX starts; default: this one")
    vllm_args: str = Field("", description="extra arguments for every vLLM server HFX starts, "
                           "e.g. '--enforce-eager --dtype float32'")
    vllm_startup_timeout: float = Field(600.0, gt=0, description="seconds a vLLM server may "
                                        "take to start")
    vllm_kv_events: bool = Field(True, description="the vLLM servers HFX starts publish their "
                                 "KV cache events (--kv-events-config, ZeroMQ) and HFX's prefix "
                                 "index follows them; off, or for --backend servers, it "
                                 "estimates what each holds from what it routed there")
    vllm_scheduler: Literal["hfx", "stock"] = Field("hfx", description=(
        "the scheduler inside the vLLM servers HFX starts: hfx plans each step as HFX's "
        "deadline-chunked planner does, from each request's SLO (--scheduler-cls "
        "hfx.backends.vllm.scheduler.HFXScheduler); stock keeps vLLM's own"))
    vllm_kv_transfer_config: str | None = Field(None, description="pd mode: vLLM's "
                                                "--kv-transfer-config JSON for every server; "
                                                "default: ExampleConnector over a temporary "
                                                "directory (one machine)")


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
    default_ttft_ms: float = Field(DEFAULT_SLO.ttft * 1e3, gt=0, description=(
        "SLO of a request that names none (Table 1's sharegpt: 2 s; a trace replayed by hfx "
        "sim gets the same)"))
    default_tpot_ms: float = Field(DEFAULT_SLO.tpot * 1e3, gt=0, description=(
        "SLO of a request that names none (Table 1's sharegpt: 0.5 s)"))
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
    front_timeout: float = Field(10.0, gt=0, allow_inf_nan=False, description=(
        "--api-workers > 1: seconds a front process may send the control process nothing "
        "(it beats every 0.5 s) before it is taken for wedged: killed, its requests aborted "
        "upstream, and replaced"))


SECTIONS: dict[str, type[Section]] = {s.section: s for s in (
    WorkloadSection, FleetSection, EngineSection, PolicySection, ScalerSection,
    AdmissionSection, ModelConfig, GatewaySection, BackendSection, VLLMSection, OutlierSection)}


