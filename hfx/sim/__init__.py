"""The simulator: the virtual clock (``clock.py``) and its timers (``timer_queue.py``), on which
the engines and the control plane run unchanged, and the driver that runs a configuration on
them (``driver.py``: ``simulate``, ``run_cluster``, ``drive``).

Nothing is imported here: the clock sits in the base layer, which every package reads, and the
driver above the cluster (tests/test_layers.py); importing one must not load the other.

The loop (docs/architecture.md "Choices worth knowing"). ``VirtualTimeLoop`` is a
``SelectorEventLoop`` whose clock, timers and iteration are a ``TimerQueue``, compiled with the
engine: when nothing is ready the clock jumps to the first live timer's own time, then the ready
callbacks run, then the timers due at that time, in the order asyncio would run them
(``Handle._run``'s context and exception handler). Its heap holds ``(when, order, timer)``
tuples, compared in C, so timers due at one instant fire in the order they were set, however
many others are pending (asyncio leaves that order to the heap's shape). ``call_at`` returns a
compiled ``Timer`` that answers as a ``TimerHandle`` does; the loop's ``time`` and ``call_at``
are the queue's bound methods, so the engine's clock reads and timers cost no Python frame.
Cancelled timers are purged when they are most of the heap, as asyncio does. Waiting with no
timer raises ``SimulationDeadlock`` instead of hanging. An empty timer callback costs ~0.6–0.8 µs
compiled (bench/sim/sim_budget.py), a task's sleep ~4 µs. The engine's simulated instances are
driven by loop timers, not tasks (hfx/engine/'s docstring, "Two drivers").

A long run's memory. A record holds every token time (~1 KB a request) and a ``Request``
~300 B, so a run that kept both for every request until its metrics grew without bound. A task
set is a ``RequestStream`` instead: each ``Request`` is built when the arrival timer reaches it,
from rows drawn a chunk at a time (hfx/workloads/task_draws.py: the same numbers as drawn whole;
a 27 M-request stream holds a few chunks). In colocated mode the ledger hands each finished
record to the run (``RequestLedger.on_done``), which takes its row and forgets it at once, and
makes the rows into columns 512 at a time (``FoldFinished``; ``--fold-records``, on by default).
P/D keeps its records, which the Migrator reads after a request's end, and a rejected, shed or
aborted record is kept, since its instance may still report it. The metrics are computed from
columns in the order the ledger opened the records, so every golden case is the same to the
last bit folded or kept (tests/test_golden.py::test_folding_records_changes_nothing); the
columns keep 77 B a request and the percentiles exact. Where that is too much (an hour of 1,000
instances is 162 M requests, 12 GB of columns), ``--metrics streaming`` folds each batch into
counters and sketches (hfx/records/streaming.py): memory that does not grow with the run.
Measured: bench/sim/memory.py, docs/performance.md "Memory of a long run".
"""
