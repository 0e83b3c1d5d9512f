"""The simulator: the virtual clock (``clock.py``) and its timers (``timer_queue.py``), on which
the engines and the control plane run unchanged, and the driver that runs a configuration on
them (``driver.py``: ``simulate``, ``run_cluster``, ``drive``).

Nothing is imported here: the clock sits in the base layer, which every package reads, and the
driver above the cluster (tests/test_layers.py); importing one must not load the other.
"""
