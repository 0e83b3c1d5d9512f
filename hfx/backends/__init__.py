"""Where instances run: one registration line per backend, chosen by ``--engine``.

``hfx`` is HFX's own engine core in this process or in Ray actors (``local.py``,
``ray/``: the simulated and the PyTorch executor); ``vllm`` is vLLM OpenAI servers, started or
attached (``vllm/``); ``openai`` is any OpenAI-compatible server, attached (``openai/``: what a
server lacks is probed, said at start and done without). A backend gives ``hfx serve`` its
fleet (a ``Placement``), the dispatcher's step-time profile and the model's limits, and ``hfx
profile`` a measured profile (``base.Backend``); the control plane sees only the ``Instance``
and ``Placement`` protocols (hfx/cluster/). Adding one (TensorRT-LLM) is a folder here and a
line in ``hfx/engines.py``, the registry of their names (below the configuration, which reads
them).
"""
