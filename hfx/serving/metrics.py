"""Prometheus metrics of the gateway, through ``prometheus_client``.

Each server has its own registry (no process-global state, so several servers in one process —
tests, benchmarks — keep apart). Counters and latency histograms are updated as each request
ends; gauges (queues, KV use, instances) and the control plane's own counters are read from it
when ``/metrics`` is scraped. docs/grafana/hfx.json is a dashboard over these names.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hfx.cluster.control import ControlPlane
from hfx.request import Outcome, RequestRecord
from hfx.serving.calibrator import LiveCalibrator
from hfx.serving.tenancy import RateLimits, TenantLabels

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds; spans sub-ms CPU steps to multi-second queues.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
           60.0)
SCALING_ACTIONS = ("scale_out", "scale_in", "switch_role", "launch_failed")


class _ControlPlaneCollector(Collector):
    """What the control plane knows at scrape time."""

    def __init__(self, control: ControlPlane, calibrator: LiveCalibrator | None,
                 limits: RateLimits | None, tenant_label: TenantLabels) -> None:
        self.control = control
        self.calibrator = calibrator
        self.limits = limits
        self.tenant_label = tenant_label

    def collect(self) -> Iterator[Metric]:
        control = self.control
        if self.calibrator is not None:
            fit = self.calibrator.last
            yield _gauge("hfx_step_model_decode_scale", "Decode-step scale the dispatcher "
                         "applies to its profile, fitted on served requests (1: none yet).",
                         fit.decode_scale if fit is not None else 1.0)
            yield _gauge("hfx_token_delivery_seconds", "Fitted time from an engine's step to "
                         "the gateway's record of its token (reported, not planned with).",
                         fit.delivery if fit is not None else 0.0)
            yield CounterMetricFamily("hfx_calibrations", "Step-time model fits on served "
                                      "requests (applied or not).",
                                      value=self.calibrator.rounds)
        yield _gauge("hfx_queued_requests", "Requests waiting for a placement (the "
                     "dispatcher's queue and those held for their tenant's turn).",
                     control.num_queued())
        ledger = control.ledger
        yield _gauge("hfx_in_flight_requests", "Requests submitted and not ended.",
                     len(ledger.records) - ledger.num_done)
        per_instance = (("hfx_instance_running", "Sequences running on the instance.",
                         "num_running"),
                        ("hfx_instance_waiting", "Sequences waiting on the instance.",
                         "num_waiting"),
                        ("hfx_instance_kv_usage", "Fraction of KV blocks in use.", "kv_usage"),
                        ("hfx_instance_kv_cached_blocks", "KV blocks of the prefix cache that "
                         "no request holds (free to evict).", "kv_cached_blocks"))
        stats = {i: inst.stats() for i, inst in control.instances.items()}
        for name, text, attr in per_instance:
            family = GaugeMetricFamily(name, text, labels=["instance", "role"])
            for i, s in sorted(stats.items()):
                family.add_metric([str(i), s.role.value], getattr(s, attr))
            yield family
        for name, text, attr in (
                ("hfx_instance_prefix_cache_queried_tokens", "Prompt tokens the instance's "
                 "prefix cache was asked for (first admissions).", "prefix_queried_tokens"),
                ("hfx_instance_prefix_cache_hit_tokens", "Of them, tokens found cached.",
                 "prefix_hit_tokens")):
            counter = CounterMetricFamily(name, text, labels=["instance", "role"])
            for i, s in sorted(stats.items()):
                counter.add_metric([str(i), s.role.value], getattr(s, attr))
            yield counter
        yield from self._prefix_index(control)
        states: Tally[tuple[str, str]] = Tally()
        fleet = control.fleet
        for i, inst in control.instances.items():
            state = ("draining" if i in fleet.draining else
                     "ejected" if i in fleet.ejected else "active")
            states[inst.role.value, state] += 1
        for inst in control.retired.values():
            states[inst.role.value, "retired"] += 1
        family = GaugeMetricFamily("hfx_instances", "Instances by role and state.",
                                   labels=["role", "state"])
        for (role, state), n in sorted(states.items()):
            family.add_metric([role, state], n)
        yield family
        yield CounterMetricFamily("hfx_instance_failures", "Instances that failed (executor "
                                  "error, process or node lost).",
                                  value=control.num_instance_failures)
        yield CounterMetricFamily("hfx_resumed_requests", "Requests resumed on another "
                                  "instance after theirs failed.", value=control.num_resumed)
        yield from self._outliers(control)
        yield from self._tenants(control)
        events = control.scaler.state.events if control.scaler is not None else []
        actions = Tally(e.action for e in events)
        scaling = CounterMetricFamily("hfx_scaling_events", "Scale-out and scale-in decisions.",
                                      labels=["action"])
        for action in SCALING_ACTIONS:
            scaling.add_metric([action], actions[action])
        yield scaling


    def _tenants(self, control: ControlPlane) -> Iterator[Metric]:
        """Requests fair shares hold for their turn, and those rate limits refused, by
        tenant."""
        held = GaugeMetricFamily("hfx_tenant_held_requests", "Requests fair shares hold for "
                                 "their turn (a dispatcher that places on arrival, saturated).",
                                 labels=["tenant"])
        counts: Tally[str] = Tally()
        if control.fair is not None:
            for tenant, n in control.fair.held_by().items():
                counts[self.tenant_label(tenant)] += n
        for tenant, n in sorted(counts.items()):
            held.add_metric([tenant], n)
        yield held
        refused = CounterMetricFamily("hfx_tenant_rate_limited", "Requests refused (429) "
                                      "for their tenant's rate limit.", labels=["tenant"])
        limited: Tally[str] = Tally()
        for tenant, n in (self.limits.refused.items() if self.limits is not None else ()):
            limited[self.tenant_label(tenant)] += n
        for tenant, n in sorted(limited.items()):
            refused.add_metric([tenant], n)
        yield refused

    @staticmethod
    def _outliers(control: ControlPlane) -> Iterator[Metric]:
        """Broken upstream streams by kind, and what outlier ejection made of them
        (hfx/cluster/outliers.py)."""
        faults = CounterMetricFamily("hfx_upstream_faults", "Upstream streams that broke, by "
                                     "how (dropped, malformed, error-event, status, no-finish, "
                                     "stalled, unreachable).", labels=["instance", "kind"])
        for i, inst in sorted({**control.retired, **control.instances}.items()):
            for kind, n in sorted(getattr(inst, "faults", {}).items()):
                faults.add_metric([str(i), kind], n)
        yield faults
        detector = control.outliers
        for name, text, counts in (
                ("hfx_ejections", "Times broken streams in a row took the instance out of "
                 "dispatch.", detector.ejected),
                ("hfx_readmissions", "Times an ejected instance took work again.",
                 detector.readmitted),
                ("hfx_ejections_spared", "Ejections the share bound refused (the fleet would "
                 "have been left short).", detector.spared)):
            family = CounterMetricFamily(name, text, labels=["instance"])
            for i, n in sorted(counts.items()):
                family.add_metric([str(i)], n)
            yield family

    @staticmethod
    def _prefix_index(control: ControlPlane) -> Iterator[Metric]:
        """Where the prefix index learns each instance's cache, what it holds, and what became
        of each vLLM server's KV events (hfx/backends/vllm/kv_events.py)."""
        index = control.fleet.prefix
        if index is None:
            return
        source = GaugeMetricFamily("hfx_prefix_index_source", "Where the prefix index learns "
                                   "what the instance caches (engine, kv-events, estimate).",
                                   labels=["instance", "source"])
        units = GaugeMetricFamily("hfx_prefix_index_units", "Cached units the prefix index "
                                  "holds for the instance.", labels=["instance"])
        predicted = CounterMetricFamily(
            "hfx_prefix_index_predicted_hit_tokens", "Prompt tokens the prefix index said the "
            "instance held as requests were dispatched there (against "
            "hfx_instance_prefix_cache_hit_tokens: how true the index is).", labels=["instance"])
        for i, src in sorted(index.sources.items()):
            source.add_metric([str(i), src], 1)
            units.add_metric([str(i)], index.units_held(i))
            predicted.add_metric([str(i)], index.predicted_hits.get(i, 0))
        yield source
        yield units
        yield predicted
        events = CounterMetricFamily("hfx_kv_events", "vLLM KV events by what became of them "
                                     "(applied; malformed, out_of_order, orphan, unknown_block, "
                                     "skipped and missed never reach the index).",
                                     labels=["instance", "outcome"])
        for i, inst in sorted(control.instances.items()):
            translator = getattr(inst, "events", None)
            if translator is not None:
                for outcome, n in sorted(translator.counts.items()):
                    events.add_metric([str(i), outcome], n)
        yield events


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


class Metrics:
    def __init__(self, control: ControlPlane, calibrator: LiveCalibrator | None = None,
                 limits: RateLimits | None = None, tenants: frozenset[str] = frozenset()
                 ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.tenant_label = TenantLabels(tenants)  # bounded: header values are the client's
        self._tenant_requests = Counter("hfx_tenant_requests", "Requests ended, by tenant and "
                                        "outcome.", ["tenant", "outcome"], registry=r)
        self._tenant_slo = Counter("hfx_tenant_slo", "Finished requests that met or missed "
                                   "their SLO, by tenant.", ["tenant", "result"], registry=r)
        self._tenant_tokens = Counter("hfx_tenant_tokens", "Prompt and output tokens of "
                                      "ended requests, by tenant.", ["tenant"], registry=r)
        self._requests = Counter("hfx_requests", "Requests ended, by task and outcome "
                                 "(finished, rejected, shed, aborted, failed).",
                                 ["outcome", "task"], registry=r)
        self._slo = Counter("hfx_slo", "Finished requests that met or missed their SLO.",
                            ["result", "task"], registry=r)
        self._tokens = Counter("hfx_generated_tokens", "Output tokens streamed.", registry=r)
        self._prompt_tokens = Counter("hfx_prompt_tokens", "Prompt tokens of ended requests.",
                                      registry=r)
        self._cached_tokens = Counter("hfx_prompt_cached_tokens", "Prompt tokens of ended "
                                      "requests found in an engine's prefix cache (over "
                                      "hfx_prompt_tokens: the hit rate).", ["task"], registry=r)
        self._latency = {
            metric: Histogram(f"hfx_{metric}_seconds", f"{text}, seconds (finished requests).",
                              ["task"], buckets=BUCKETS, registry=r)
            for metric, text in (("ttft", "Time to first token"),
                                 ("tpot", "Time per output token"),
                                 ("e2e", "End-to-end latency"),
                                 ("queue", "Time from arrival to dispatch"))}
        r.register(_ControlPlaneCollector(control, calibrator, limits, self.tenant_label))

    def observe(self, record: RequestRecord) -> None:
        """A request ended: count it, and its latencies if it finished."""
        task = record.request.task
        self._requests.labels(record.outcome.value, task).inc()
        tenant = self.tenant_label(record.request.tenant)
        self._tenant_requests.labels(tenant, record.outcome.value).inc()
        self._tenant_tokens.labels(tenant).inc(record.request.prompt_len + record.num_tokens)
        if record.outcome is Outcome.FINISHED:
            self._tenant_slo.labels(tenant, "met" if record.meets_slo() else "missed").inc()
        if record.outcome is Outcome.FINISHED:
            self._slo.labels("met" if record.meets_slo() else "missed", task).inc()
            for metric in ("ttft", "tpot", "e2e"):
                value = getattr(record, metric)
                if value is not None:
                    self._latency[metric].labels(task).observe(value)
            if record.queue_time is not None:
                self._latency["queue"].labels(task).observe(record.queue_time)
        self._tokens.inc(record.num_tokens)
        self._prompt_tokens.inc(record.request.prompt_len)
        self._cached_tokens.labels(task).inc(record.cached_tokens)

    def count(self, task: str, outcome: str) -> int:
        """Requests of ``task`` that ended with ``outcome`` so far."""
        want = {"outcome": outcome, "task": task}
        return next((int(s.value) for m in self._requests.collect() for s in m.samples
                     if s.name == "hfx_requests_total" and s.labels == want), 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
