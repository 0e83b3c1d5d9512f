"""TorchExecutor: runs a planned step through a real model (PyTorch, CPU or GPU).

The engine core's plan ({sequence: tokens to compute}) becomes one flat batch: each sequence
contributes the tokens from its ``num_computed_tokens`` on, each token's K/V goes to the slot its
block table gives, and sequences that have caught up with their tokens sample one. The forward
pass runs on a worker thread so that the event loop (the gateway, the control plane) keeps
serving while the model computes; torch releases the GIL inside its kernels.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from hfx.engine.config import EngineConfig
from hfx.engine.core import EngineCore
from hfx.engine.planners.base import SchedulerOutput
from hfx.engine.sequence import Sequence
from hfx.model.sampler import sample
from hfx.model.transformer import AttentionMetadata, CausalLM, DecodeGroup, PrefillSpan
from hfx.stepmodel.latency import StepTimeModel

# A decode group's longest context over its shortest (decode_groups): more groups cost a call
# each, a wider spread pads more.
DECODE_GROUP_SPREAD = 2.0


@dataclass(slots=True)
class _Batch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: list[int]
    sample_seqs: list[Sequence]


def _token(seq: Sequence, pos: int) -> int:
    prompt = seq.prompt_token_ids
    assert prompt is not None
    return prompt[pos] if pos < seq.prompt_len else seq.output_token_ids[pos - seq.prompt_len]


def decode_groups(seqs: list[Sequence], spread: float = DECODE_GROUP_SPREAD
                  ) -> list[list[Sequence]]:
    """Decoding sequences in groups of similar context length, shortest first: a group's
    longest context is at most ``spread`` times its shortest. Attention pads each group to its
    longest, so a step costs about Σ context (Eq. 2's term, and what paged attention costs)
    instead of B × the longest: one 1,000-token context among seven of ~100 made a padded step
    2.6× slower than the same Σ in even contexts (mini model, CPU)."""
    groups: list[list[Sequence]] = []
    for seq in sorted(seqs, key=lambda s: s.num_computed_tokens):
        if groups and seq.num_computed_tokens + 1 <= spread * (groups[-1][0].num_computed_tokens
                                                               + 1):
            groups[-1].append(seq)
        else:
            groups.append([seq])
    return groups


def _tokens(seq: Sequence, start: int, end: int) -> list[int]:
    prompt = seq.prompt_token_ids
    assert prompt is not None
    if end <= seq.prompt_len:
        return prompt[start:end]
    return (prompt + seq.output_token_ids)[start:end]


class TorchExecutor:
    needs_token_ids = True

    def __init__(self, model: CausalLM, num_kv_blocks: int, block_size: int,
                 threaded: bool = True, seed: int = 0) -> None:
        self.model = model
        self.block_size = block_size
        self.vocab_size = model.shape.vocab_size
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        shape = model.shape
        self.caches = [torch.zeros(2, num_kv_blocks * block_size, shape.num_key_value_heads,
                                   shape.head_dim, dtype=self.dtype, device=self.device)
                       for _ in range(shape.num_hidden_layers)]
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hfx-model") if threaded else None
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        self.decode_group_spread = DECODE_GROUP_SPREAD  # inf: one padded batch (the old way)

    async def execute(self, out: SchedulerOutput) -> dict[Sequence, int]:
        if self._pool is None:
            return self.run(out)
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.run, out)

    def run(self, out: SchedulerOutput) -> dict[Sequence, int]:
        """One forward pass and sampling, synchronously."""
        batch = self._prepare(out)
        if batch is None:
            return {}
        hidden = self.model(batch.input_ids, batch.positions, self.caches, batch.meta)
        if not batch.sample_rows:
            return {}
        rows = torch.tensor(batch.sample_rows, device=self.device)
        logits = self.model.logits(hidden[rows])
        seqs = batch.sample_seqs
        tokens = sample(logits, [s.sampling for s in seqs], [s.num_tokens for s in seqs],
                        self._generator)
        return dict(zip(seqs, tokens, strict=True))

    def logits(self, out: SchedulerOutput) -> torch.Tensor:
        """Logits of every scheduled token (for tests against a reference implementation)."""
        batch = self._prepare(out)
        assert batch is not None
        hidden = self.model(batch.input_ids, batch.positions, self.caches, batch.meta)
        return self.model.logits(hidden)

    # ---- building the flat batch --------------------------------------------------------
    def _slots(self, seq: Sequence, start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        table = torch.tensor(seq.block_table, dtype=torch.long)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _decode_slots(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor,
                                                            torch.Tensor]:
        """Context slots of decoding sequences at once, padded to the longest context:
        (slots [b, width], mask [b, width], new-token slots [b])."""
        bs = self.block_size
        lengths = torch.tensor([s.num_computed_tokens + 1 for s in seqs])
        blocks = max(len(s.block_table) for s in seqs)
        table = torch.tensor([s.block_table + [0] * (blocks - len(s.block_table)) for s in seqs])
        pos = torch.arange(int(lengths.max()))
        slots = table[:, pos // bs] * bs + pos % bs
        mask = pos[None, :] < lengths[:, None]
        slots.masked_fill_(~mask, 0)
        return slots, mask, slots.gather(1, (lengths - 1)[:, None])[:, 0]

    def _prepare(self, out: SchedulerOutput) -> _Batch | None:
        """Prefill chunks first (one span each), then decodes (one padded batch)."""
        ids: list[int] = []
        positions: list[int] = []
        slot_parts: list[torch.Tensor] = []
        prefills: list[PrefillSpan] = []
        decodes: list[Sequence] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        for seq, n in out.num_scheduled_tokens.items():
            if seq.prompt_token_ids is None:
                raise ValueError(f"request {seq.request_id}: a real executor needs token ids")
            if n == 1:
                decodes.append(seq)
                continue
            start, row = seq.num_computed_tokens, len(ids)
            end = start + n
            ids.extend(_tokens(seq, start, end))
            positions.extend(range(start, end))
            context = self._slots(seq, 0, end)
            slot_parts.append(context[start:])
            prefills.append(PrefillSpan(row, row + n, start, context.to(self.device)))
            if end == seq.num_tokens:
                sample_rows.append(row + n - 1)
                sample_seqs.append(seq)
        dev = self.device
        meta = AttentionMetadata(slot_mapping=torch.empty(0), prefills=prefills)
        for group in decode_groups(decodes, self.decode_group_spread):
            slots, mask, new = self._decode_slots(group)
            start = len(ids)
            for seq in group:
                p = seq.num_computed_tokens
                if p + 1 == seq.num_tokens:  # else a one-token chunk of a longer prompt
                    sample_rows.append(len(ids))
                    sample_seqs.append(seq)
                ids.append(_token(seq, p))
                positions.append(p)
            slot_parts.append(new)
            meta.decodes.append(DecodeGroup(start, len(ids), slots.to(dev),
                                            mask[:, None, None, :].to(dev)))
        if not ids:
            return None
        meta.slot_mapping = torch.cat(slot_parts).to(dev)
        return _Batch(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), meta,
                      sample_rows, sample_seqs)

    # ---- KV transfer (P/D): a sequence's cache leaves one executor for another -------------
    def read_kv(self, seq: Sequence) -> torch.Tensor:
        """[layers, 2, tokens, kv_heads, head_dim] of the sequence's computed tokens, on CPU."""
        slots = self._slots(seq, 0, seq.num_computed_tokens).to(self.device)
        return torch.stack([c[:, slots] for c in self.caches]).cpu()

    def write_kv(self, seq: Sequence, kv: torch.Tensor) -> None:
        """Place transferred KV into the blocks reserved for ``seq`` here."""
        n = kv.shape[2]
        if n != seq.num_computed_tokens or len(self.caches) != kv.shape[0]:
            raise ValueError(f"request {seq.request_id}: KV of {n} tokens and {kv.shape[0]} "
                             f"layers does not match {seq.num_computed_tokens} computed tokens")
        slots = self._slots(seq, 0, n).to(self.device)
        kv = kv.to(device=self.device, dtype=self.dtype)
        for layer, cache in enumerate(self.caches):
            cache[0].index_copy_(0, slots, kv[layer, 0])
            cache[1].index_copy_(0, slots, kv[layer, 1])

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def real_engine(model: CausalLM, config: EngineConfig, threaded: bool = True,
                seed: int = 0, step_model: StepTimeModel | None = None) -> EngineCore:
    """An engine core whose executor runs ``model`` (a checkpoint or random weights);
    ``step_model`` (its measured profile) for planners that pace by time."""
    return EngineCore(config, TorchExecutor(model, config.num_kv_blocks, config.block_size,
                                            threaded=threaded, seed=seed), step_model)
