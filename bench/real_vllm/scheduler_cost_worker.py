"""Run in vLLM's own environment by bench/real_vllm/scheduler_cost.py: the CPU time of vLLM's
``schedule`` and ``update_from_output``, stock and HFX's scheduler (hfx/backends/vllm/
scheduler.py), driven with a fake model output as tests/test_vllm_scheduler.py drives them.

    python bench/real_vllm/scheduler_cost_worker.py CHECKPOINT WORK_DIR STEPS SEQS...

Each case: ``seqs - 1`` requests decoding for the whole run and one short request arriving
every step (a 128-token prompt, 4 output tokens), so that each step plans decodes, a prompt
and a waiting queue; every request carries an SLO in its extra arguments. HFX's scheduler
plans from the probe's profile (written to WORK_DIR). Prints JSON: the profile and the runs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput

# The probe's builders (a real Scheduler on a fake KV config, requests) and its profile.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "helpers"))
from vllm_scheduler_probe import PROFILE, request, scheduler

from hfx.backends.vllm.scheduler import HFXScheduler

SLO = {"hfx_ttft_ms": 1_000, "hfx_tpot_ms": 100}
WARMUP = 20  # steps before timing: the decoders' prompts done, the queue in its steady state


def case(cls: type[Scheduler], checkpoint: str, profile: str | None, seqs: int,
         steps: int) -> dict[str, float]:
    s = scheduler(cls, checkpoint, profile, num_blocks=16 * seqs + 4096, max_num_seqs=seqs)
    for i in range(seqs - 1):
        s.add_request(request(f"long{i}", 32, 100_000, SLO))
    cpu_schedule = cpu_update = 0.0
    tokens = 0
    for k in range(WARMUP + steps):
        s.add_request(request(f"short{k}", 128, 4, SLO))
        t0 = time.process_time()
        out = s.schedule()
        t1 = time.process_time()
        scheduled = dict(out.num_scheduled_tokens)
        ids = list(scheduled)
        sampled = [[7] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens
                   else [] for r in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        t2 = time.process_time()
        s.update_from_output(out, mro)
        t3 = time.process_time()
        if k >= WARMUP:
            cpu_schedule += t1 - t0
            cpu_update += t3 - t2
            tokens += out.total_num_scheduled_tokens
    planned = getattr(s, "hfx_planned_steps", None)
    return {"seqs": seqs, "steps": steps, "schedule_us": 1e6 * cpu_schedule / steps,
            "update_us": 1e6 * cpu_update / steps, "tokens_per_step": tokens / steps,
            "hfx_planned_steps": planned}


def main() -> None:
    checkpoint, work, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    seqs = [int(x) for x in sys.argv[4:]]
    profile = str(work / "profile.json")
    Path(profile).write_text(json.dumps(PROFILE))
    out = []
    for n in seqs:
        # Stock and HFX's alternated, each twice: a stall of the shared host falls on both.
        for rep in range(2):
            for name, cls, prof in (("stock", Scheduler, None), ("hfx", HFXScheduler, profile)):
                out.append({"scheduler": name, "repeat": rep,
                            **case(cls, checkpoint, prof, n, steps)})
    print(json.dumps({"profile": PROFILE, "runs": out}))


if __name__ == "__main__":
    main()
