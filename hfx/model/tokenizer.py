"""Tokenizers: a checkpoint's tokenizer.json through the ``tokenizers`` library, else bytes.

The byte-level tokenizer maps each UTF-8 byte to its value (ids 0–255) and reserves 256 for
end-of-text, so any random-weight model with a vocabulary of at least 257 can serve text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    eos_token_id: int | None

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
