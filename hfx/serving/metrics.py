"""Prometheus metrics of the gateway, in the text exposition format (version 0.0.4).

Counters and latency histograms are updated as each request ends; gauges (queues, KV use,
instances) are read from the control plane when ``/metrics`` is scraped.
"""

from __future__ import annotations

from collections import defaultdict

from hfx.cluster.control import ControlPlane
from hfx.request import Outcome, RequestRecord

# Seconds; spans sub-ms CPU steps to multi-second queues.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _labels(labels: dict[str, str | int]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), "")}"'
                     for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, b in enumerate(BUCKETS):
            if value <= b:
                self.counts[i] += 1

    def render(self, name: str, labels: dict[str, str]) -> list[str]:
        lines = [f"{name}_bucket{_labels({**labels, 'le': b})} {c}"
                 for b, c in zip(BUCKETS, self.counts, strict=True)]
        lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {self.total}")
        lines.append(f"{name}_sum{_labels(labels)} {self.sum}")
        lines.append(f"{name}_count{_labels(labels)} {self.total}")
        return lines


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = defaultdict(int)  # (task, outcome)
        self.slo: dict[tuple[str, str], int] = defaultdict(int)  # (task, met|missed)
        self.latency: dict[tuple[str, str], Histogram] = defaultdict(Histogram)  # (metric, task)
        self.tokens = 0

    def observe(self, record: RequestRecord) -> None:
        task = record.request.task
        self.requests[task, record.outcome.value] += 1
        if record.outcome is Outcome.FINISHED:
            self.slo[task, "met" if record.meets_slo() else "missed"] += 1
            for metric in ("ttft", "tpot", "e2e"):
                value = getattr(record, metric)
                if value is not None:
                    self.latency[metric, task].observe(value)
        self.tokens += record.num_tokens

    def render(self, control: ControlPlane) -> str:
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        family("hfx_requests_total", "counter", "Requests ended, by task and outcome.")
        for (task, outcome), n in sorted(self.requests.items()):
            out.append(f"hfx_requests_total{_labels({'task': task, 'outcome': outcome})} {n}")
        family("hfx_slo_total", "counter", "Finished requests that met or missed their SLO.")
        for (task, result), n in sorted(self.slo.items()):
            out.append(f"hfx_slo_total{_labels({'task': task, 'result': result})} {n}")
        family("hfx_generated_tokens_total", "counter", "Output tokens streamed.")
        out.append(f"hfx_generated_tokens_total {self.tokens}")
        for metric, text in (("ttft", "Time to first token"), ("tpot", "Time per output token"),
                             ("e2e", "End-to-end latency")):
            family(f"hfx_{metric}_seconds", "histogram", f"{text}, seconds.")
            for (m, task), h in sorted(self.latency.items()):
                if m == metric:
                    out += h.render(f"hfx_{metric}_seconds", {"task": task})
        family("hfx_queued_requests", "gauge", "Requests in the dispatcher's queue.")
        out.append(f"hfx_queued_requests {control.policy.num_queued()}")
        family("hfx_in_flight_requests", "gauge", "Requests submitted and not ended.")
        pending = sum(r.outcome is Outcome.PENDING for r in control.records.values())
        out.append(f"hfx_in_flight_requests {pending}")
        gauges = (("hfx_instance_running", "Sequences running on the instance.", "num_running"),
                  ("hfx_instance_waiting", "Sequences waiting on the instance.", "num_waiting"),
                  ("hfx_instance_kv_usage", "Fraction of KV blocks in use.", "kv_usage"))
        stats = {i: inst.stats() for i, inst in control.instances.items()}
        for name, text, attr in gauges:
            family(name, "gauge", text)
            for i, s in sorted(stats.items()):
                out.append(f"{name}{_labels({'instance': i, 'role': s.role.value})} "
                           f"{getattr(s, attr)}")
        family("hfx_instances", "gauge", "Instances by role and state.")
        by: dict[tuple[str, str], int] = defaultdict(int)
        for i, inst in control.instances.items():
            by[inst.role.value, "draining" if i in control.fleet.draining else "active"] += 1
        for inst in control.retired.values():
            by[inst.role.value, "retired"] += 1
        for (role, state), n in sorted(by.items()):
            out.append(f"hfx_instances{_labels({'role': role, 'state': state})} {n}")
        family("hfx_instance_failures_total", "counter", "Instances that failed (executor "
               "error, process or node lost).")
        out.append(f"hfx_instance_failures_total {control.num_instance_failures}")
        family("hfx_resumed_requests_total", "counter", "Requests resumed on another instance "
               "after theirs failed.")
        out.append(f"hfx_resumed_requests_total {control.num_resumed}")
        family("hfx_scaling_events_total", "counter", "Scale-out and scale-in decisions.")
        events = control.scaler.state.events if control.scaler is not None else []
        actions: dict[str, int] = defaultdict(int)
        for e in events:
            actions[e.action] += 1
        for action in ("scale_out", "scale_in", "switch_role", "launch_failed"):
            out.append(f"hfx_scaling_events_total{_labels({'action': action})} "
                       f"{actions[action]}")
        return "\n".join(out) + "\n"
