# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""What a request must satisfy to ever run on an engine (its size against the model's context
and the KV cache, its token ids). A module of its own: it travels to remote instances' proxies
(pickled), and the engine core does not. Compiled with it (hfx/native.py): every submit checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from hfx.engine.errors import EngineError


@dataclass(frozen=True, slots=True)
class Admission:
    """What a request must satisfy to ever run on an engine. Picklable: a remote instance's
    proxy refuses a request the engine would refuse, without a round trip."""

    max_model_len: int
    num_kv_blocks: int
    block_size: int
    needs_token_ids: bool  # a real model runs on token ids
    vocab_size: int | None

    def __reduce__(self) -> tuple[type[Admission], tuple[int, int, int, bool, int | None]]:
        # Through the constructor: compiled, a frozen class cannot be unpickled field by field.
        return Admission, (self.max_model_len, self.num_kv_blocks, self.block_size,
                           self.needs_token_ids, self.vocab_size)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def check_size(self, prompt_len: int, max_tokens: int) -> None:
        total = prompt_len + max_tokens
        if total > self.max_model_len:
            raise EngineError(f"prompt ({prompt_len}) + max_tokens ({max_tokens}) exceeds the "
                              f"model's context of {self.max_model_len} tokens")
        if self.blocks_for(total) > self.num_kv_blocks:
            raise EngineError(f"request of {total} tokens exceeds the KV cache "
                              f"({self.num_kv_blocks * self.block_size} tokens)")

    def check(self, request_id: str, prompt_len: int, max_tokens: int,
              ids: list[int] | None) -> None:
        self.check_size(prompt_len, max_tokens)
        if ids is None:
            if self.needs_token_ids:
                raise EngineError(f"request {request_id}: this engine runs a real model "
                                  "and needs prompt token ids")
            return
        if len(ids) != prompt_len:
            raise EngineError(f"request {request_id}: {len(ids)} prompt token ids for a "
                              f"prompt_len of {prompt_len}")
        vocab = self.vocab_size
        if vocab is not None and ids and not 0 <= min(ids) <= max(ids) < vocab:
            raise EngineError(f"request {request_id}: token ids must be in [0, {vocab})")
