"""Where instances run, one package per backend: ``local`` (engines on this process's loop:
the simulator and the own PyTorch engine), ``ray`` (each instance a Ray actor), ``vllm`` (vLLM
OpenAI servers, started or attached). The control plane sees only the ``Instance`` and
``Placement`` protocols (hfx/cluster/instance.py, placement.py)."""
