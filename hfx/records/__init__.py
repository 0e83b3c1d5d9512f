"""What a run's records become: the metrics' columns (``columns.py``), the summary metrics
(``metrics.py``), and their streaming form in fixed memory (``streaming.py``, with
``sketch.py``'s latency sketch). Read by the simulator and the evaluation; they see only
``hfx.request``'s records.

A record holds every token time (~1 KB a request); the metrics read fifteen numbers of it (77 B).
``RecordRows`` takes a finished record's row as it ends, ``RecordColumns`` makes a batch of rows
into columns (the per-token deadline check vectorised), and ``RecordFold`` keeps the columns in
the order the ledger opened the records, so the metrics are the same to the last bit whether a
run folds its records as they end or keeps them (hfx/sim/'s docstring has the run's side).
``StreamingFold`` (``--metrics streaming``) keeps counters and ``LatencySketch``es per group
(all, each task, each priority) instead: counts, attainment (both metrics), goodput, the backlog
and the longest wait are exact; means are sums over batches (the last bits may differ);
percentiles are DDSketch's (Masson et al., VLDB 2019), within 0.5% of ``np.percentile``'s,
relatively (tests/test_streaming_metrics.py checks all of it against the exact path).
"""
