"""The seeds' task tables: Table 1's tasks and task sets, PolyServe's tiers, our bursty cycle.

Plain data with no numpy, so the CLI can list and validate workload names without loading the
generators (hfx/workloads/load.py draws requests from these tables).
"""

from __future__ import annotations

from dataclasses import dataclass

from hfx.request import SLO

MAX_LEN = 16384  # clip for sampled lengths (tokens)
DEFAULT_REQUESTS_PER_TASK = 300  # HyperFlexis §7.3


@dataclass(frozen=True, slots=True)
class TaskSpec:
    name: str
    slo: SLO
    input_mean: float
    input_std: float
    output_mean: float
    output_std: float


# HyperFlexis Table 1.
TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("medical_qa", SLO(0.7, 0.5), 32.57, 10.32, 38.92, 16.83),
        TaskSpec("tldr_content_gen", SLO(1.0, 0.7), 44.38, 6.58, 96.04, 35.03),
        TaskSpec("tldr_headline_gen", SLO(2.0, 0.9), 121.82, 35.04, 13.59, 6.55),
        TaskSpec("wikisql", SLO(20.0, 1.0), 643.22, 337.01, 27.82, 4.84),
        TaskSpec("gsm8k", SLO(0.7, 0.2), 51.44, 15.78, 90.13, 26.73),
        TaskSpec("sharegpt", SLO(2.0, 0.5), 259.19, 324.88, 207.79, 234.99),
    )
}


# SLOs-Serve §6: ChatBot, Coder and Summarizer, lengths as its Table 4 (mean, std). Its SLOs
# (Tables 1 and 3): a tight prefill is 3x the zero-load TTFT, a loose one 5x; a tight decode 50
# ms, a loose one 100 ms. It scales TTFT per request; here per task, from the task's mean
# prompt prefilled alone on Qwen2.5-7B/910B (0.117 s for 1,333 tokens, 0.079 s for 847, 0.073 s
# for 763), the default fleet.
SLOS_SERVE_TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("summarizer", SLO(0.35, 0.1), 1333.0, 444.0, 202.0, 234.0),  # tight, loose
        TaskSpec("coder", SLO(0.4, 0.05), 847.0, 617.0, 26.0, 47.0),  # loose, tight
        TaskSpec("chatbot", SLO(0.36, 0.1), 763.0, 424.0, 266.0, 160.0),  # loose, loose
    )
}


# The SLO of a request that names none, in hfx serve (--default-ttft-ms, --default-tpot-ms) and
# in a trace replayed by hfx sim / hfx whatif: Table 1's sharegpt, general chat.
DEFAULT_SLO = TASKS["sharegpt"].slo


def _with_slo(task: TaskSpec, slo: SLO) -> TaskSpec:
    return TaskSpec(task.name, slo, task.input_mean, task.input_std, task.output_mean,
                    task.output_std)


WORKLOADS: dict[str, tuple[TaskSpec, ...]] = {
    "four-task": tuple(TASKS[n] for n in
                       ("medical_qa", "tldr_content_gen", "tldr_headline_gen", "wikisql")),
    "two-task": (TASKS["gsm8k"], TASKS["sharegpt"]),
    # Single-task evaluation (HyperFlexis §9.2): wikisql with TTFT 0.7 s and TPOT 0.5 s.
    "wikisql": (_with_slo(TASKS["wikisql"], SLO(0.7, 0.5)),),
    # Every Table 1 task at once (ours): the comparison protocol tunes each policy's
    # knobs on it (hfx/evaluation/compare.py), and evaluates none of them on it.
    "six-task": tuple(TASKS.values()),
    # SLOs-Serve §6's Mixed scenario (ours as a held-out tuning workload: no evaluated
    # workload has its tasks, lengths or SLOs; hfx/evaluation/compare.py --tuning-workload).
    "slos-serve-mixed": tuple(SLOS_SERVE_TASKS.values()),
}


# Bursts (ours): a task set whose rate cycles 30 s at half the mean, then 10 s at 2.5×
# (mean: the given QPS), Poisson within each phase.
BURSTY = {"bursty-four-task": ("four-task", ((30.0, 0.5), (10.0, 2.5)))}


# PolyServe's setting (PolyServe §5.1): TPOT tiers 20/30/50/100 ms with 10/20/30/40% of the
# requests, TTFT drawn from {300, 500, 1000} ms, lengths uniform with the given means.
TIERS = ((0.02, 0.1), (0.03, 0.2), (0.05, 0.3), (0.1, 0.4))
TTFTS = (0.3, 0.5, 1.0)
TIERED = {"tiered-512-512": (512, 512), "tiered-4096-1024": (4096, 1024)}
