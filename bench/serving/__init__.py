"""Serving and the data plane: the gateway, the relay over vLLM's streams, the front channel, Ray,
soak and stress."""
