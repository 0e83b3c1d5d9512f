"""Checkpoints and tokenizers: our files read by transformers, theirs by us, bad ones refused."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hfx.model.build import build_model  # noqa: E402
from hfx.model.shapes import SHAPES, ModelShape, get_shape  # noqa: E402
from hfx.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer  # noqa: E402
from hfx.model.weights import (  # noqa: E402
    CheckpointError,
    load_checkpoint,
    random_model,
    save_checkpoint,
)


def test_checkpoint_round_trip_and_transformers_reads_it(tmp_path):
    model = random_model(get_shape("tiny", model_type="llama", tie_word_embeddings=False), 3)
    save_checkpoint(model, tmp_path)
    again = load_checkpoint(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[5, 17, 300, 2, 99]])
    with torch.no_grad():
        theirs = ref(ids).logits[0]
    from hfx.engine.block_manager import BlockManager
    from hfx.engine.planners.base import SchedulerOutput
    from hfx.engine.sequence import Sequence
    from hfx.engine.torch_executor import TorchExecutor

    seq = Sequence("a", 5, 1, prompt_token_ids=ids[0].tolist())
    BlockManager(4, 4).allocate(seq, 5)
    out = SchedulerOutput()
    out.schedule(seq, 5)
    assert torch.allclose(TorchExecutor(again, 4, 4, threaded=False).logits(out), theirs,
                          atol=1e-4)


def test_we_read_a_checkpoint_transformers_wrote(tmp_path):
    config = transformers.Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=1, tie_word_embeddings=True)
    transformers.Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    model = load_checkpoint(tmp_path)
    assert model.shape.vocab_size == 300 and model.shape.num_key_value_heads == 1
    assert model.lm_head is None


def test_bad_checkpoints_are_refused_with_the_reason(tmp_path):
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="unsupported model_type"):
        load_checkpoint(tmp_path)
    save_checkpoint(random_model(get_shape("tiny")), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_size"] = 128
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        load_checkpoint(tmp_path)


def test_shapes_match_published_parameter_counts():
    # Qwen2.5 model cards: 0.49B and 7.61B parameters.
    assert SHAPES["qwen2.5-0.5b"].num_parameters == pytest.approx(0.494e9, rel=0.01)
    assert SHAPES["qwen2.5-7b"].num_parameters == pytest.approx(7.62e9, rel=0.01)
    assert SHAPES["llama-3.1-8b"].num_parameters == pytest.approx(8.03e9, rel=0.01)
    m = random_model(get_shape("tiny"))
    assert get_shape("tiny").num_parameters == sum(p.numel() for p in m.parameters())
    with pytest.raises(ValueError, match="multiple"):
        ModelShape(vocab_size=10, hidden_size=10, intermediate_size=4, num_hidden_layers=1,
                   num_attention_heads=3, num_key_value_heads=1)


def test_tokenizers(tmp_path):
    byte = ByteTokenizer()
    assert byte.decode(byte.encode("héllo, world")) == "héllo, world"
    assert byte.decode([104, 105, 256, 400]) == "hi"
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path, eos_token_id=0)
    assert isinstance(loaded, HFTokenizer)
    assert loaded.encode("hello world") == [1, 2]
    assert loaded.decode([1, 2]) == "hello world"


def test_build_model_from_a_shape_or_a_checkpoint(tmp_path):
    built = build_model("tiny", device="cpu")
    assert built.name == "tiny-random" and isinstance(built.tokenizer, ByteTokenizer)
    save_checkpoint(built.model, tmp_path / "ckpt")
    again = build_model(checkpoint=tmp_path / "ckpt", device="cpu")
    assert again.name == "ckpt" and again.model.shape == built.model.shape
    with pytest.raises(ValueError, match="unknown model shape"):
        build_model("gpt-5")
