"""Engine configuration: one validated dataclass (nano-vllm style)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hfx.engine.sequence import Role


@dataclass(slots=True)
class EngineConfig:
    num_kv_blocks: int
    block_size: int = 16  # tokens per KV block (vLLM's default)
    max_num_seqs: int = 256  # running sequences at most (vLLM's default)
    # Tokens one step may compute; None takes the planner's own default (prefill-first 8192,
    # chunked 2048: vLLM v1's online-serving budget).
    max_num_batched_tokens: int | None = None
    max_model_len: int = 32768  # prompt + output tokens of one request (Qwen2.5's context)
    planner: str = "prefill-first"
    # The planner's tunables (its ``tunables``) where they differ from its defaults.
    planner_params: dict[str, float] = field(default_factory=dict)
    role: Role = Role.COLOCATED
    # Fraction of blocks a new admission must leave free, so that running decodes do not need to
    # preempt right away (vLLM v0's watermark, 1%).
    watermark: float = 0.01
    # Decodes advanced by one counter per step (cohort.py) for planners whose decode steps take
    # every decoding sequence; False steps each sequence on its own. Results are identical
    # either way: False is the check of that (``--engine-runs off``).
    engine_runs: bool = True
    # Full KV blocks of known content shared between requests and kept after them until
    # evicted (prefix_cache.py); on by default, as in vLLM v1 (``--enable-prefix-caching``).
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        self.role = Role(self.role)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_kv_blocks)
