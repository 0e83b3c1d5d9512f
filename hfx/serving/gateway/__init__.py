"""The OpenAI-compatible HTTP gateway: completions and chat completions (raw ASGI,
completions.py), models, health, readiness, metrics (FastAPI, app.py), the API key and body
limit (access.py), and running it (run.py)."""

from hfx.serving.gateway.access import Access
from hfx.serving.gateway.app import Gateway, create_app
from hfx.serving.gateway.run import serve

__all__ = ["Access", "Gateway", "create_app", "serve"]
