"""Workloads: the papers' task tables (tasks.py), arrivals and traces loaded or generated
(load.py), trace file formats (traces.py), and the metrics every run is scored by (metrics.py)."""
