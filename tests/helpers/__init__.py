"""What the tests share: a live gateway (live.py), a fake vLLM server (fake_vllm.py), the real-vLLM
tier's environment (vllm_tier.py)."""
