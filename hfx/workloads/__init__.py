"""Workloads: the papers' task tables (tasks.py), the kinds of workload and their entry points
(kinds.py), arrivals and requests generated (load.py, task_draws.py, stream_rows.py,
sessions.py), their submission at arrival times on the virtual loop (arrivals.py), and trace
file formats (traces.py). What a run's records become is hfx/records/.

A task set is read as a ``RequestStream``: its rows are drawn a chunk at a time, the same
numbers as drawn whole (task_draws.py), and each ``Request`` is built when the run reaches it,
so a long run holds a few chunks, not five numbers a request.
"""
