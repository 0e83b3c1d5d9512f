"""Tokenizers: a checkpoint's tokenizer.json through the ``tokenizers`` library, else bytes.

The byte-level tokenizer maps each UTF-8 byte to its value (ids 0–255) and reserves 256 for
end-of-text, so any random-weight model with a vocabulary of at least 257 can serve text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class Tokenizer(Protocol):
    @property  # read-only, so that ByteTokenizer's int matches int | None
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    vocab_size = 257
    eos_token_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # Ids past the bytes (a random model may sample them) decode to nothing.
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer.json file (the ``tokenizers`` library; no ``transformers`` needed)."""

    def __init__(self, path: str | Path, eos_token_id: int | None = None) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        self._tok = _Tokenizer.from_file(str(path))
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(checkpoint: str | Path | None, eos_token_id: int | None = None) -> Tokenizer:
    """The checkpoint's tokenizer.json when there is one; the byte tokenizer otherwise."""
    if checkpoint is not None:
        path = Path(checkpoint) / "tokenizer.json"
        if path.is_file():
            return HFTokenizer(path, eos_token_id)
    return ByteTokenizer()


EOS = "<|endoftext|>"


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, in byte order, so that id == byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def write_byte_tokenizer(folder: Path, max_len: int) -> None:
    """A tokenizer.json (+ config) that ``AutoTokenizer.from_pretrained`` loads and that
    encodes text exactly as ``ByteTokenizer`` does: GPT-2's byte-level alphabet, no merges,
    one token per UTF-8 byte, 256 = end of text. A random-weight checkpoint carries it, so
    that tools which load a Hugging Face tokenizer (vLLM, guidellm) read text as HFX does."""
    vocab = {c: b for b, c in byte_level_alphabet().items()} | {EOS: 256}
    spec: dict[str, Any] = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 256, "content": EOS, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS,
         "model_max_length": max_len}))
