"""What a run's records become: the metrics' columns (``columns.py``), the summary metrics
(``metrics.py``), and their streaming form in fixed memory (``streaming.py``, with
``sketch.py``'s latency sketch). Read by the simulator and the evaluation; they see only
``hfx.request``'s records.
"""
