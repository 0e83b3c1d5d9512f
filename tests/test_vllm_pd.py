"""P/D over real vLLM servers (issue 15, HyperFlexis §5.1): the ``vllm`` tier.

One prefill and one decode vLLM CPU server, both started with vLLM's ExampleConnector over a
shared directory: HFX's P stage sends the prompt to the prefill server for its first token,
the Migrator places the request on the decode server, whose connector loads the prompt's KV
instead of computing it. The greedy output must equal ``transformers``' on the same weights
(and so the colocated output), and the decode server must have taken the prompt's KV from the
connector.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm

from helpers.vllm_tier import ARGS, PYTHON, vllm_metrics  # noqa: E402  (skips without vLLM)

# isort: split
from helpers.live import Running  # noqa: E402

from hfx.engine import Role  # noqa: E402
from hfx.model.tokenizer import ByteTokenizer  # noqa: E402


@pytest.fixture(scope="module")
def gw(mini_checkpoint):
    # A shipped profile instead of measuring these servers at start: under the profiler's
    # batches every request also goes through the connector, and vLLM 0.32's ExampleConnector
    # (a debugging connector) once killed the engine there ("In connector.start_load_kv, but
    # the attn_metadata is None", then EngineDeadError). What is tested here is the KV path
    # and the output, which the profile does not touch.
    running = Running(engine="vllm", checkpoint=mini_checkpoint, mode="pd", prefill=1, decode=1,
                      vllm_python=PYTHON, vllm_args=ARGS, kv_capacity_tokens=16384,
                      max_model_len=2048, policy="hfx", max_wait=None, profile="tiny@cpu")
    yield running
    running.close()


def test_pd_output_equals_transformers_and_the_kv_came_through_the_connector(gw, mini_checkpoint):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(mini_checkpoint,
                                                              torch_dtype=torch.float32)
    instances = gw.server.control.instances.values()
    (decode,) = [i for i in instances if i.role is Role.DECODE]
    (prefill,) = [i for i in instances if i.role is Role.PREFILL]
    before = vllm_metrics(decode.url).get("vllm:external_prefix_cache_hits_total", 0)
    generated = vllm_metrics(prefill.url).get("vllm:generation_tokens_total", 0)
    tok = ByteTokenizer()
    prompt = "A prompt long enough to fill more than one KV block of thirty-two tokens, twice."
    ids = torch.tensor([tok.encode(prompt)])
    want = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, ids.shape[1]:].tolist()
    r = gw.client.completions.create(model=gw.model, prompt=prompt, max_tokens=16,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].text == tok.decode(want)
    assert r.usage.completion_tokens == 16
    # The decode server loaded the prompt's full blocks from the connector, not computed them.
    hits = vllm_metrics(decode.url).get("vllm:external_prefix_cache_hits_total", 0) - before
    assert hits == (len(ids[0]) // 32) * 32 > 0
    # The prefill server ran the prompt for one token and nothing more.
    assert vllm_metrics(prefill.url).get("vllm:generation_tokens_total") - generated == 1
