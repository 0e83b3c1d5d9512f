"""Workloads: the papers' task tables (tasks.py), the kinds of workload and their entry points
(kinds.py), arrivals and requests generated (load.py, task_draws.py, sessions.py), and trace
file formats (traces.py). What a run's records become is hfx/records/."""
