"""Against real vLLM CPU servers: fidelity, live calibration, the relay beside vLLM's own API
server."""
