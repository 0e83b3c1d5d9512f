"""Analytic (roofline) step-time profiles from a model config and a hardware spec.

No accelerator is at hand to profile, so the shipped profiles are computed. For one engine step
on an instance of ``tp`` devices:

    flops  = 2·P_layers·T + 2·V·h·S + 4·L·d_attn·A
    bytes  = W + kv·(T_new + C_read)
    t_step = max(flops / (tp·F·η_f), bytes / (tp·M·η_m)) + t_comm + t_fixed
    t_comm = 2·L · [2(tp−1)/tp · T·h·2 bytes / link + α]          (tp > 1; two all-reduces a layer)

with T the tokens in the step, S the sequences that sample a token, A the attention work
(Σ c·(k + c/2) for a prefill chunk of c new tokens over k cached ones; Σ l_cur for decodes),
P_layers the transformer parameters, V·h the LM head, W the weight bytes, kv the KV bytes per
token, F peak dense FP16/BF16 FLOP/s, M HBM bandwidth, η the efficiencies stated in HARDWARE,
t_fixed the per-step host overhead (scheduling, launch). This is the max-form of SLOs-Serve §3.1.1.

The HFX form (Eq. 1/2, hfx/stepmodel/latency.py) is then fitted to this roofline on the grid of
HyperFlexis Appendix A (batch sizes 1…192, input lengths 4…2020), minimising squared relative error,
and the fit's MAPE is stored with the profile. Regenerate the shipped files with
``python -m hfx.stepmodel.roofline``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from hfx.stepmodel.latency import Profile, StepTimeModel, fit_decode, fit_prefill

BYTES_FP16 = 2


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shape of a decoder-only transformer (Hugging Face config names in comments)."""

    name: str
    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    intermediate: int  # intermediate_size (SwiGLU: three matrices)
    vocab: int  # vocab_size
    tp: int  # tensor parallel degree used by the seeds (HyperFlexis §7.2)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        attn = 2 * self.hidden * self.heads * self.head_dim  # q and o projections
        attn += 2 * self.hidden * self.kv_heads * self.head_dim  # k and v projections
        return self.layers * (attn + 3 * self.hidden * self.intermediate)

    @property
    def params(self) -> int:
        return self.layer_params + 2 * self.vocab * self.hidden  # untied embedding and LM head

    @property
    def weight_bytes(self) -> int:
        return self.params * BYTES_FP16

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * BYTES_FP16


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One device. Peak numbers are the vendor's; efficiencies are ours, stated here."""

    name: str
    flops: float  # peak dense FP16/BF16 FLOP/s
    mem_bw: float  # HBM bytes/s
    mem_bytes: float  # HBM capacity
    link_bw: float  # intra-node device link, bytes/s one way
    flops_eff: float  # achieved fraction of peak in GEMMs
    bw_eff: float  # achieved fraction of HBM bandwidth
    step_overhead: float  # per-step host overhead, seconds
    allreduce_latency: float  # fixed cost of one all-reduce, seconds
    mem_util: float = 0.9  # fraction of HBM the engine may use (vLLM's default)
    activation_reserve: float = 2e9  # bytes per device kept for activations


# Qwen2.5 and Llama-3 shapes from their published config.json files.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, tp=1),
        ModelSpec("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, tp=2),
        ModelSpec("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, tp=8),
        # PolyServe's model (PolyServe §5.1), on one device.
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, tp=1),
    )
}

HARDWARE: dict[str, HardwareSpec] = {
    h.name: h
    for h in (
        # NVIDIA H200 SXM: 989 TFLOP/s dense BF16, 4.8 TB/s HBM3e, 141 GB, NVLink 900 GB/s
        # (450 GB/s each way). Efficiencies: 60% of peak in GEMMs, 80% of HBM bandwidth, 3 ms
        # per-step host overhead (vLLM's scheduler and launch at small batch).
        HardwareSpec("h200", 989e12, 4.8e12, 141e9, 450e9, 0.6, 0.8, 3e-3, 10e-6),
        # Huawei Ascend 910B (the seeds' device): 313 TFLOP/s FP16, 1.6 TB/s HBM2e, 64 GB
        # (HyperFlexis §7.1), HCCS 720 Gb/s = 90 GB/s (HFX paper §4.1). Efficiencies: 55% of peak,
        # 65% of bandwidth, 10 ms per-step host overhead (vLLM-Ascend runs eager on aarch64
        # hosts, whose single-thread speed HyperFlexis §5.1 calls limited).
        HardwareSpec("ascend-910b", 313e12, 1.6e12, 64e9, 90e9, 0.55, 0.65, 10e-3, 20e-6),
    )
}


@dataclass(frozen=True, slots=True)
class Roofline:
    """Roofline step times of one model on one instance of ``model.tp`` devices."""

    model: ModelSpec
    hw: HardwareSpec

    def _time(self, flops: float, nbytes: float, tokens: int) -> float:
        tp, hw = self.model.tp, self.hw
        compute = flops / (tp * hw.flops * hw.flops_eff)
        memory = nbytes / (tp * hw.mem_bw * hw.bw_eff)
        comm = 0.0
        if tp > 1:
            msg = tokens * self.model.hidden * BYTES_FP16
            per = 2 * (tp - 1) / tp * msg / hw.link_bw + hw.allreduce_latency
            comm = 2 * self.model.layers * per
        return max(compute, memory) + comm + hw.step_overhead

    def prefill(self, lengths: list[int]) -> float:
        m = self.model
        tokens = sum(lengths)
        attn = sum(c * c / 2 for c in lengths)
        flops = (2 * m.layer_params * tokens + 2 * m.vocab * m.hidden * len(lengths)
                 + 4 * m.layers * m.hidden * attn)
        nbytes = m.weight_bytes + m.kv_bytes_per_token * tokens
        return self._time(flops, nbytes, tokens)

    def decode(self, batch: int, sum_ctx: int) -> float:
        m = self.model
        flops = (2 * (m.layer_params + m.vocab * m.hidden) * batch
                 + 4 * m.layers * m.hidden * sum_ctx)
        nbytes = m.weight_bytes + m.kv_bytes_per_token * (sum_ctx + batch)
        return self._time(flops, nbytes, batch)

    @property
    def kv_capacity_tokens(self) -> int:
        m, hw = self.model, self.hw
        free = m.tp * (hw.mem_bytes * hw.mem_util - hw.activation_reserve) - m.weight_bytes
        if free <= 0:
            raise ValueError(f"{m.name} does not fit on {m.tp}× {hw.name}")
        return int(free // m.kv_bytes_per_token)


def weight_bytes_per_device(meta: dict) -> float | None:
    """Weight bytes each device of an instance holds, if the profile records its model."""
    m = meta.get("model")
    if not m:
        return None
    spec = ModelSpec(**m)
    return spec.weight_bytes / spec.tp


def kv_bytes_from_meta(meta: dict) -> int | None:
    """KV bytes per token of the model a profile was made for, if its config is recorded."""
    m = meta.get("model")
    if not m:
        return None
    return m["layers"] * 2 * m["kv_heads"] * (m["hidden"] // m["heads"]) * BYTES_FP16


# HyperFlexis Appendix A profiling grid.
GRID_BATCH = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192)
GRID_LENGTH = (4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 284, 512, 768, 1024, 1536, 2020)
MAX_PREFILL_TOKENS = 16384  # prefill batches above this are never planned by the engine


def build_profile(model_name: str, hardware_name: str, block_size: int = 16) -> Profile:
    """Fit the HFX form to the roofline on the Appendix A grid."""
    rl = Roofline(MODELS[model_name], HARDWARE[hardware_name])
    pre = [([n] * b, rl.prefill([n] * b)) for b in GRID_BATCH for n in GRID_LENGTH
           if b * n <= MAX_PREFILL_TOKENS]
    dec = [(b, b * n, rl.decode(b, b * n)) for b in GRID_BATCH for n in GRID_LENGTH]
    (pa, pb, pc, _), pre_mape = fit_prefill(pre)  # whole prompts: no hits
    (da, db, dc), dec_mape = fit_decode(dec)
    return Profile(
        name=f"{model_name}@{hardware_name}",
        model=StepTimeModel(pa, pb, pc, da, db, dc),
        kv_capacity_tokens=rl.kv_capacity_tokens,
        block_size=block_size,
        source="roofline",
        fit_mape={"prefill": round(pre_mape, 6), "decode": round(dec_mape, 6)},
        meta={"model": asdict(rl.model), "hardware": asdict(rl.hw)},
    )


def main() -> None:
    out = Path(__file__).parent / "profiles"
    for model in MODELS:
        for hw in HARDWARE:
            prof = build_profile(model, hw)
            prof.save(out / f"{prof.name}.json")
            m = prof.model
            print(f"{prof.name:28s} prefill a={m.prefill_a*1e3:.2f}ms b={m.prefill_b*1e6:.2f}us "
                  f"c={m.prefill_c*1e9:.3f}ns  decode a'={m.decode_a*1e3:.2f}ms "
                  f"b'={m.decode_b*1e9:.2f}ns c'={m.decode_c*1e6:.1f}us "
                  f"kv={prof.kv_capacity_tokens}"
                  f"  mape={prof.fit_mape}")


if __name__ == "__main__":
    main()
