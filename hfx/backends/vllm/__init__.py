"""vLLM OpenAI servers as instances: the instance (instance.py), its relayed streams
(upstream.py), started servers and their warm pool (process.py), servers as Ray actors
(ray_actor.py), their /metrics (metrics.py), re-admitting attached servers (healer.py), and
profiling a server's step times (profiler.py)."""
