"""The real engine against Hugging Face ``transformers`` (a reference nobody here wrote).

Same random weights in both; logits must agree within 1e-4 and greedy generation token for token,
also when requests are batched, chunked, preempted and resumed, or moved between instances.
"""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hfx.engine import EngineConfig, EngineCore, EngineError, RequestStatus, Role  # noqa: E402
from hfx.engine.block_manager import BlockManager  # noqa: E402
from hfx.engine.planners.base import SchedulerOutput  # noqa: E402
from hfx.engine.sequence import Sequence  # noqa: E402
from hfx.engine.torch_executor import TorchExecutor, decode_groups  # noqa: E402
from hfx.model.shapes import get_shape  # noqa: E402
from hfx.model.weights import random_model  # noqa: E402
from hfx.sampling import SamplingParams  # noqa: E402

LOGIT_ATOL = 1e-4  # float32; observed difference 0.0 on CPU (same kernels, same order)


def reference(model) -> transformers.PreTrainedModel:
    """transformers' own implementation of the same architecture, with our weights."""
    config = model.shape.to_hf_config()
    for k in ("architectures", "torch_dtype"):
        config.pop(k)
    if model.shape.model_type == "qwen2":
        ref = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config))
    else:
        ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    missing, unexpected = ref.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    return ref.eval()


def reference_greedy(ref, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts(count: int, seed: int = 0, low: int = 3, high: int = 60) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=gen).tolist()
    return [torch.randint(0, 512, (n,), generator=gen).tolist() for n in lengths]


def run_engine(engine: EngineCore, seqs: list[Sequence]) -> dict[str, list[int]]:
    async def go() -> None:
        for s in seqs:
            engine.add_request(s)
        while engine.has_work():
            await engine.step()
    asyncio.run(go())
    return {s.request_id: s.output_token_ids for s in seqs}


def make_engine(model, num_blocks: int = 128, block_size: int = 16, **kw) -> EngineCore:
    executor = TorchExecutor(model, num_blocks, block_size, threaded=kw.pop("threaded", False))
    return EngineCore(EngineConfig(num_kv_blocks=num_blocks, block_size=block_size, **kw),
                      executor)


@pytest.fixture(scope="module")
def model():
    return random_model(get_shape("tiny"), seed=1)


@pytest.fixture(scope="module")
def ref(model):
    return reference(model)


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_prefill_logits_match_transformers(model_type):
    m = random_model(get_shape("tiny", model_type=model_type), seed=2)
    prompt = prompts(1, seed=3, low=40, high=41)[0]
    with torch.no_grad():
        want = reference(m)(torch.tensor([prompt])).logits[0]
    executor = TorchExecutor(m, 8, 16, threaded=False)
    seq = Sequence("a", len(prompt), 1, prompt_token_ids=prompt)
    BlockManager(8, 16).allocate(seq, len(prompt))
    out = SchedulerOutput()
    out.schedule(seq, len(prompt))
    assert torch.allclose(executor.logits(out), want, atol=LOGIT_ATOL)


def test_chunked_logits_match_whole_prefill(model, ref):
    prompt = prompts(1, seed=4, low=50, high=51)[0]
    with torch.no_grad():
        want = ref(torch.tensor([prompt])).logits[0]
    executor = TorchExecutor(model, 32, 4, threaded=False)
    seq = Sequence("a", len(prompt), 1, prompt_token_ids=prompt)
    BlockManager(32, 4).allocate(seq, len(prompt))
    got = []
    for chunk in (7, 1, 30, 12):  # unaligned with the block size on purpose
        out = SchedulerOutput()
        out.schedule(seq, chunk)
        got.append(executor.logits(out))
        seq.num_computed_tokens += chunk
    assert torch.allclose(torch.cat(got), want, atol=LOGIT_ATOL)


def test_batched_greedy_generation_matches_transformers(model, ref):
    ps = prompts(6, seed=5)
    want = {f"r{i}": reference_greedy(ref, p, 12) for i, p in enumerate(ps)}
    engine = make_engine(model)
    seqs = [Sequence(f"r{i}", len(p), 12, prompt_token_ids=p) for i, p in enumerate(ps)]
    assert run_engine(engine, seqs) == want
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_decode_groups_keep_contexts_within_twice_the_shortest():
    seqs = [Sequence(f"r{n}", n, 4, num_computed_tokens=n) for n in
            (100, 7, 1000, 60, 130, 2000, 12)]
    groups = decode_groups(seqs)
    assert [[s.num_computed_tokens for s in g] for g in groups] == [
        [7, 12], [60, 100], [130], [1000, 2000]]


def test_decodes_of_far_apart_contexts_match_transformers(model, ref):
    """Decode groups (contexts 5 to 400 tokens here, four groups) give each sequence the
    tokens it gets alone."""
    gen = torch.Generator().manual_seed(9)
    ps = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 9, 40, 150, 400)]
    want = {f"r{i}": reference_greedy(ref, p, 10) for i, p in enumerate(ps)}
    engine = make_engine(model)
    seqs = [Sequence(f"r{i}", len(p), 10, prompt_token_ids=p) for i, p in enumerate(ps)]
    assert run_engine(engine, seqs) == want


def test_chunked_prefill_and_preemption_give_the_same_tokens(model, ref):
    ps = prompts(5, seed=6, low=20, high=60)
    want = {f"r{i}": reference_greedy(ref, p, 20) for i, p in enumerate(ps)}
    # 24 blocks of 4 tokens cannot hold five 40–80-token sequences: decodes preempt and
    # recompute; 16-token chunks split every prompt.
    engine = make_engine(model, num_blocks=24, block_size=4, planner="chunked",
                         max_num_batched_tokens=16)
    seqs = [Sequence(f"r{i}", len(p), 20, prompt_token_ids=p) for i, p in enumerate(ps)]
    assert run_engine(engine, seqs) == want
    assert sum(s.num_preemptions for s in seqs) > 0


def test_threaded_executor_gives_the_same_tokens(model, ref):
    p = prompts(1, seed=7)[0]
    engine = make_engine(model, threaded=True)
    assert run_engine(engine, [Sequence("a", len(p), 8, prompt_token_ids=p)]) == {
        "a": reference_greedy(ref, p, 8)}


def test_seeded_sampling_does_not_depend_on_the_batch(model):
    p = prompts(3, seed=8)
    hot = SamplingParams(temperature=1.0, top_p=0.9, seed=42)
    alone = run_engine(make_engine(model), [Sequence("a", len(p[0]), 16, prompt_token_ids=p[0],
                                                     sampling=hot)])["a"]
    together = run_engine(make_engine(model), [
        Sequence(f"r{i}", len(x), 16, prompt_token_ids=x, sampling=hot if i == 0 else
                 SamplingParams(temperature=0.7, seed=i)) for i, x in enumerate(p)])["r0"]
    assert alone == together
    greedy = run_engine(make_engine(model), [Sequence("g", len(p[0]), 16,
                                                      prompt_token_ids=p[0])])["g"]
    assert alone != greedy  # temperature 1 over a random model's flat distribution
    nucleus = SamplingParams(temperature=1.0, top_p=1e-6, seed=1)  # only the top token
    assert run_engine(make_engine(model), [Sequence("n", len(p[0]), 16, prompt_token_ids=p[0],
                                                    sampling=nucleus)])["n"] == greedy


def test_stop_tokens_and_max_tokens(model, ref):
    p = prompts(1, seed=9)[0]
    greedy = reference_greedy(ref, p, 10)
    stop = greedy[4]
    engine = make_engine(model)
    s = Sequence("a", len(p), 10, prompt_token_ids=p, stop_token_ids=frozenset({stop}))
    out = run_engine(engine, [s])["a"]
    assert out == greedy[:greedy.index(stop) + 1]
    assert s.status is RequestStatus.FINISHED_STOPPED
    s2 = Sequence("b", len(p), 3, prompt_token_ids=p)
    assert run_engine(make_engine(model), [s2])["b"] == greedy[:3]
    assert s2.status is RequestStatus.FINISHED_LENGTH


def test_kv_transfer_between_instances_keeps_the_tokens(model, ref):
    """P/D: prefill on one engine, move the KV, decode on another (HyperFlexis §5.1)."""
    p = prompts(1, seed=10, low=30, high=31)[0]
    want = reference_greedy(ref, p, 10)
    prefill = make_engine(model, num_blocks=16, block_size=4, role=Role.PREFILL)
    # Different block size and a used block first, so the KV lands in different slots.
    decode = make_engine(model, num_blocks=32, block_size=8, role=Role.DECODE)
    decode.kv.allocate(Sequence("other", 8, 1), 8)

    async def go() -> list[int]:
        prefill.add_request(Sequence("a", len(p), 10, prompt_token_ids=p))
        while prefill.has_work():
            await prefill.step()
        state = prefill.held["a"].migrated_copy()
        kv = prefill.export_kv("a")
        prefill.release("a")
        assert decode.reserve_import(state)
        decode.activate_import("a", kv)
        while decode.has_work():
            await decode.step()
        return state.output_token_ids

    assert asyncio.run(go()) == want
    assert prefill.kv.num_free_blocks == prefill.kv.num_blocks


def test_bad_token_ids_are_refused(model):
    engine = make_engine(model)
    with pytest.raises(EngineError, match="token ids"):
        engine.add_request(Sequence("a", 3, 4))
    with pytest.raises(EngineError, match=r"\[0, 512\)"):
        engine.add_request(Sequence("b", 2, 4, prompt_token_ids=[1, 600]))
    with pytest.raises(EngineError, match="2 prompt token ids"):
        engine.add_request(Sequence("c", 3, 4, prompt_token_ids=[1, 2]))


@pytest.mark.parametrize("planner", ["tpot-chunked", "slo-paced"])
def test_planners_that_pace_by_time_run_on_the_real_engine_with_its_profile(model, ref, planner):
    # PolyServe's and SLOs-Serve's engines read the instance's step-time model. A real
    # executor's ``model`` is its network, never taken for one: without a profile the engine
    # refuses to build, with one it serves the same greedy tokens.
    from hfx.engine.torch_executor import real_engine
    from hfx.stepmodel.latency import load_profile

    config = EngineConfig(num_kv_blocks=128, block_size=16, planner=planner)
    with pytest.raises(ValueError, match=f"planner '{planner}' needs the instance's step-time"):
        real_engine(model, config, threaded=False)
    engine = real_engine(model, config, threaded=False,
                         step_model=load_profile("tiny@cpu").model)
    ps = prompts(3, seed=9)
    seqs = [Sequence(f"r{i}", len(p), 8, prompt_token_ids=p) for i, p in enumerate(ps)]
    assert run_engine(engine, seqs) == {f"r{i}": reference_greedy(ref, p, 8)
                                        for i, p in enumerate(ps)}


def test_logits_over_a_cached_prefix_match_transformers(model, ref):
    """A prompt whose first 40 tokens another computed attends over that KV, computing its
    own 17: its logits are transformers' over the whole prompt."""
    shared = prompts(1, seed=11, low=40, high=41)[0]
    tail_a, tail_b = prompts(2, seed=13, low=17, high=18)
    executor = TorchExecutor(model, 32, 8, threaded=False)
    kv = BlockManager(32, 8)
    a = Sequence("a", 57, 1, prompt_token_ids=[*shared, *tail_a])
    kv.allocate(a, 57)
    out = SchedulerOutput()
    out.schedule(a, 57)
    executor.logits(out)
    a.num_computed_tokens = 57
    kv.free(a)
    b = Sequence("b", 57, 1, prompt_token_ids=[*shared, *tail_b])
    cached = kv.cached_prefix(b)
    assert cached == 40 and kv.allocate(b, 57, 0, cached) and b.num_computed_tokens == 40
    out = SchedulerOutput()
    out.schedule(b, 17)
    with torch.no_grad():
        want = ref(torch.tensor([b.prompt_token_ids])).logits[0, 40:]
    assert torch.allclose(executor.logits(out), want, atol=LOGIT_ATOL)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prompts_over_a_cached_prefix_match_transformers(model, ref, prefix_caching):
    """Prefix caching (hfx/engine/prefix_cache.py): later prompts that share a 40-token prefix
    with an earlier one attend over its cached KV, computing only their own tails (and the
    next turn, over the first one's answer too); the tokens are transformers' either way."""
    shared = prompts(1, seed=11, low=40, high=41)[0]
    tails = prompts(3, seed=12, low=5, high=20)
    engine = make_engine(model, num_blocks=64, block_size=8, planner="chunked",
                         prefix_caching=prefix_caching)
    first = Sequence("first", len(shared), 12, prompt_token_ids=shared)
    got = run_engine(engine, [first])
    # The next turn resends the first prompt and its answer.
    turn = [*shared, *got["first"], *tails[0]]
    later = [Sequence(f"r{i}", len(shared) + len(t), 6, prompt_token_ids=[*shared, *t])
             for i, t in enumerate(tails[1:])]
    nxt = Sequence("next", len(turn), 6, prompt_token_ids=turn)
    got.update(run_engine(engine, [*later, nxt]))
    assert got == {"first": reference_greedy(ref, shared, 12),
                   **{s.request_id: reference_greedy(ref, s.prompt_token_ids, 6)
                      for s in [*later, nxt]}}
    cached = [s.num_cached_tokens for s in [*later, nxt]]
    # 40 shared tokens are 5 blocks of 8; the next turn also finds the block its answer
    # filled (the first turn's 52 tokens had KV for 51: 6 full blocks).
    assert cached == ([40, 40, 48] if prefix_caching else [0, 0, 0])
