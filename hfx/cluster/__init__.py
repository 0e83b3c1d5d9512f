"""The decision plane: the control plane and its parts, the Scaler, and the ``Instance`` and
``Placement`` protocols that every backend's instances answer to.

``ControlPlane`` (control.py) composes parts named for their jobs — the ledger, the stages, the
fleet, migration, recovery, admission limits, fair shares, outlier ejection, HFX-PM — and routes
events between them; the same code runs on the simulator's virtual loop and under ``hfx
serve``. A request's path through it (docs/architecture.md "The request path"): ``submit`` opens
its record (ledger.py), maps a priority to an SLO (slo_mapper.py), fails a request no instance
of a stage it passes through could ever hold (``Instance.check``), sheds past the queue bound
(admission.py), and queues it at the dispatch stage (stage.py). A stage hands its policy a
``ClusterView`` built by the fleet (fleet.py: the Monitor's latest snapshot plus the control
plane's outstanding-work tallies) and applies the decision. Step outputs come back through
``on_events``: token times to the ledger and its listeners, PREFILLED requests to the Migrator,
finished ones settled, errors to recovery.

P/D (HyperFlexis §5.1; HFX paper §3.3.1, §3.4). ``--mode pd --prefill P --decode D``: instances
0..P−1 prefill, the rest decode, and two stages run, each a policy with its own view, queue and
timer. A prefill engine samples the first token (TTFT ends there) and holds the KV, counted
against its memory. The Migrator's stage (migration.py) picks a decode instance; the migration
reserves blocks there (``reserve_import``) or waits for a decode request to finish rather than
overcommit, books the transfer on the TLManager's link (tl_manager.py: tokens × KV bytes per
token / bandwidth + 0.5 ms, FIFO per link; HCCS 720 Gb/s within a node, 200 GbE across, instance
i on node ⌊i·tp/8⌋), and when it completes frees the prefill copy (``export``) and starts
decoding (``activate_import``; with every sequence slot taken it waits there, KV held). The KV
is on the decode instance exactly once; TPOT includes the transfer. Links are set up when the
fleet starts and when an instance joins or switches role.

Scaling (scaler.py, provisioner.py; HyperFlexis §6, Algorithm 3). ``--max-instances N`` starts
the Scaler, which acts through ``FleetControl`` and hears queue events through ``ScalerHooks``;
its indicators and thresholds are in its docstring. A new instance is a warm-pool runtime (by
default the free devices) loading weights by D2D, CPU or disk, modelled on Table 2 (0.5 s +
bytes / path bandwidth; 20 s more without a warm runtime), or really loaded under ``hfx serve``
(hfx/backends/engine_spec.py). Scale-in drains: the instance stops accepting, the policies
re-route what they queued for it (``Policy.on_instance_removed``), it finishes (prefill:
migrates) what it holds, then stops and its device rejoins the warm pool. In P/D, when one pool
wants to shrink while the other grows, the drained instance switches role (1 s) and is linked
to its new peers before it serves. Cost counts every instance from the scale-out decision
(loading included) to its release.

Failure (recovery.py, admission.py, outliers.py; docs/architecture.md "Failure"):

- A failed instance (its executor raised twice or with several requests in a step, its Ray
  actor or its vLLM server died) reports every request it held as aborted with the reason
  (``StepOutput.error``). The control plane drains it and ``Recovery`` resumes each request
  elsewhere — a new placement of the prompt plus the tokens already streamed, for the remaining
  ``max_tokens``, with the record's token times and listener kept — or fails it with the
  reason. Never resumed: the requests of the step that raised (``suspects``: one of them may be
  the cause), a request already resumed ``max_retries`` (1) times, and in P/D a request that had
  its first token. The Scaler starts a replacement in the same role at once (``on_failed``: no
  cool-down, no indicator), bounded by ``--max-instances``.
- With no instance accepting work and none starting (no Scaler, ``--max-instances`` reached, or
  a launch that failed), queued requests fail at once with the reason and new ones are refused.
  In P/D each stage counts on its own: with no decode instance left, the prefilled requests
  waiting for the Migrator fail too, aborted where their KV is held.
- Shedding: an arrival beyond ``max_queued`` requests at the dispatcher is shed at once; a
  request still without a first token ``max_wait`` seconds past its TTFT SLO — in the
  dispatcher's queue, HFX's best-effort tier or an instance's waiting queue — is withdrawn or
  aborted there. A request aborted or shed while queued is withdrawn from its policy
  (``Policy.withdraw``), so it is never dispatched and holds no slot in a shadow. A request
  whose prefill is under way when its wait bound passes is aborted at the end of that step and
  may stream its first token before the error.
- A stream that breaks on an upstream server ends FINISHED_LOST and is resumed as above; broken
  streams in a row eject the instance from dispatch for a while (``OutlierDetector``, Envoy's
  rule), never the last instance taking work, and its health check decides when it returns.
- Not detected: an instance that hangs without raising (no step deadline). A step that raises
  with several requests fails them all (the engine cannot tell which one caused it).

Tenants (tenants.py, fair_share.py): a weight and optional rate limits per tenant; start tags by
start-time fair queueing at VTC's token costs order HFX's Q_R within each SLO class, and hold
arrivals for a dispatcher without a queue (fair_share.py's docstring has the rule).
"""
