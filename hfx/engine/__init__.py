"""One inference instance: engine core, KV block manager, batch planners, executors.

The names below load on first use (PEP 562), so importing a light submodule (the planner
registry, the config) does not pull in the core and numpy.

How an engine works (docs/architecture.md "Engine details" is the summary; each module's
docstring has its part):

- **One rule for every step** (sequence.py): a sequence's computed-token count catches up with
  its tokens (prompt + output so far). A step computes some of the missing tokens, and a
  sequence with none missing samples the next one. Prefill, chunked prefill, decode and
  recompute after preemption are the same code, simulated or real.
- **KV** (block_manager.py): blocks of 16 tokens; the capacity comes from the profile (HBM × 0.9
  − weights − 2 GB of activations per device, ÷ KV bytes per token). ``allocate`` is
  all-or-nothing. Preemption is by recompute: the most recently admitted running sequence (in
  ``vllm``, the lowest priority) loses its KV and goes back to the waiting queue with its
  generated tokens; its next prefill covers prompt + output.
- **Planners** (planners/, ``--planner``): ``prefill-first`` (vLLM v0 and vLLM-Ascend, the seeds'
  engine: admissible waiting requests run as a prefill-only step, FCFS, 8192-token budget,
  ``max_num_seqs`` 256, 1% watermark, else every running request decodes one token; a prompt
  longer than the budget runs alone); ``chunked`` (Sarathi-Serve, vLLM v1: 2048 tokens a step,
  running requests first, then admissions with what is left, none in a step that had to
  preempt); ``credit`` (SCORPIO); ``slo-paced`` (SLOs-Serve); ``tpot-chunked`` (PolyServe);
  ``deadline-chunked`` (HFX's, ours); ``vllm`` and ``vllm-fcfs`` (vLLM v1's scheduler).
  ``pacing.py`` is the paced-chunk arithmetic, shared with HFX's scheduler inside vLLM.
- **Prefix cache** (prefix_cache.py, block_manager.py; ``--prefix-caching``, on by default):
  vLLM v1's KV cache manager, in the block manager every engine has. A waiting sequence's first
  allocation starts from the cached units of its prefix (whole units, at least one token left to
  compute), held by reference count and counted as computed; the step's shape charges its chunk
  over the cached context (Eq. 1's Σc·(k + c)). A sequence offers its prompt's units as they are
  planned and its output's when it lets its KV go (finished, preempted, aborted). A unit another
  sequence cached meanwhile stays the second one's own, uncached (vLLM's duplicate blocks). A
  step that failed drops the units only it held. Hits are counted as vLLM 0.32 counts them:
  prompt tokens and hits at a request's first admission, none after a preemption. The decode
  cohort takes crossing blocks in counts, which evicts alike (tests/test_prefix_cache.py). With
  no request that names its content, every result is bit-identical to the code without the
  cache (the golden tests).
- **Roles** (sequence.py, core.py): ``colocated``; ``prefill`` (after its first token a sequence
  is PREFILLED and keeps its KV until ``release()`` hands it over for migration); ``decode``
  (``reserve_import`` allocates blocks for an incoming sequence's KV or refuses;
  ``activate_import`` starts it, or, while ``max_num_seqs`` sequences run, queues it with its KV
  until a slot frees, FIFO). With a real executor ``export_kv`` returns a copy of the KV
  (``[layers, 2, tokens, kv_heads, head_dim]``, a CPU tensor, picklable) and
  ``activate_import`` writes it into the reserved blocks, whatever their size; simulated, both
  are None.
- **The decode cohort and decode runs** (cohort.py, tick_calendar.py, decode_run.py): planners
  whose decode step takes every decoding sequence (``plans_cohort``: prefill-first,
  tpot-chunked, deadline-chunked; chunked and vLLM's in every step that preempts nobody,
  ``plan_cohort_first``) advance them by one counter; on the virtual clock, with an
  executor that knows its steps' times ahead (``SimExecutor.advances_runs``), a stretch of cohort
  steps nothing can change is one ``step()`` and one timer. With a simulated executor
  (``plans_by_shape``) a step's output says the cohort ticked instead of listing its members:
  the ledger keeps a tick log per instance, and a record holds its cohort tokens as
  ``TokenRun``s into it. A real executor gets the members one by one and reports every token.
  Neither may change a result: every golden case runs both ways to the last bit
  (tests/test_golden.py::test_engine_runs_change_nothing), and tests/test_engine_runs.py
  compares them over random engines and clusters. ``--no-engine-runs`` turns both off.
- **Two drivers of one step loop** (hfx/backends/local.py): a real executor's step is awaited by
  a task (``step()`` = ``begin_step``, the executor's ``execute``, ``end_step``). A simulated step
  is only a wait (``steps_are_waits``), so the simulator calls ``begin_step`` and sets a loop
  timer at start + duration whose callback is ``end_step`` and the next ``begin_step`` (a decode
  run's timer calls ``end_run``: ``arm_run``). Both give the same run
  (test_timer_driver_runs_as_the_task_driver), except by construction against another timer due
  at the very same instant: the timer driver ends a step in its timer's callback, the task
  driver one callback later. An executor replaced mid-run (a fault injected) is handed to the
  task driver at its next step.
- **Failures** (errors.py): a step that raises ``StepFailed`` with one request in it fails that
  request alone (FINISHED_FAILED) and the engine goes on; a step with several requests, or a
  second failing step in a row, takes the executor for broken, and the instance fails.
- **The real engine** (torch_executor.py, hfx/model/): one flat batch a step, prefill chunks
  first; attention per prefill chunk (causal mask offset by the cached prefix) and per group of
  decodes whose longest context is at most twice the shortest (``decode_groups``: one padded call
  for every decode cost B × the longest context, where paged attention costs Σ context). Checked
  against Hugging Face ``transformers`` with the same weights (tests/test_torch_executor.py):
  logits agree to 1e-4, greedy tokens are identical with batching, chunking, preemption and a KV
  move between instances.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hfx.registry import lazy_exports

if TYPE_CHECKING:  # the lazy names' types: without them, mypy and mypyc see Any
    from hfx.engine.admission import Admission  # noqa: F401
    from hfx.engine.config import EngineConfig  # noqa: F401
    from hfx.engine.core import EngineCore, StepOutput  # noqa: F401
    from hfx.engine.errors import EngineError, StepFailed  # noqa: F401
    from hfx.engine.executor import Executor, SimExecutor  # noqa: F401
    from hfx.engine.sequence import FINISH_REASON, RequestStatus, Role, Sequence  # noqa: F401
    from hfx.engine.stats import InstanceStats  # noqa: F401

_EXPORTS = {
    "EngineConfig": "hfx.engine.config",
    "Admission": "hfx.engine.admission",
    "EngineCore": "hfx.engine.core",
    "EngineError": "hfx.engine.errors",
    "StepFailed": "hfx.engine.errors",
    "StepOutput": "hfx.engine.core",
    "Executor": "hfx.engine.executor",
    "SimExecutor": "hfx.engine.executor",
    "FINISH_REASON": "hfx.engine.sequence",
    "RequestStatus": "hfx.engine.sequence",
    "Role": "hfx.engine.sequence",
    "Sequence": "hfx.engine.sequence",
    "InstanceStats": "hfx.engine.stats",
}


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
