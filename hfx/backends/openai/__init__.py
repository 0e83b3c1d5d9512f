"""The ``openai`` backend: any OpenAI-compatible server as an instance (SGLang, llama.cpp's
server, vLLM without its extras, another ``hfx serve``), attached with ``--backend``.

Each server is probed when it joins (``probe.py``): its model and context length from
``/v1/models``, a health path, whether it takes token-id prompts (required: HFX tokenizes once),
whether it streams token ids (else each event's text is tokenized where the stream is read),
whether it is an ``hfx serve`` (then each request's SLO travels with it) and whether it serves
vLLM's Prometheus names (its KV use). What a server lacks is said at start, once per server,
and degraded: no priority scheduling (HFX's queue orders requests; the server runs what it is
sent first come, first served), no KV events (the prefix index estimates what HFX routed
there), no engine metrics (load and KV use from HFX's own accounting), abort by closing the
connection. The instance is vLLM's (hfx/backends/vllm/instance.py) with the request body and
stats of a generic server (``instance.py``); the backend is ``backend.py``.
"""
