"""The OpenAI-compatible request bodies and error objects the gateway accepts and returns.

Fields clients commonly send but HFX does not use (``user``, ``logprobs`` of 0, ...) are ignored;
a field of the wrong type, a missing one, or a value out of range is a 400 with an OpenAI-style
error object. HFX adds ``slo`` ({"ttft_ms", "tpot_ms"}), ``priority`` (0 = most important) and
``task`` (a configured task class), and ``ignore_eos`` as vLLM does (for benchmarks).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RETRY_AFTER_SECONDS = 5  # told to clients and load balancers while nothing can serve
MAX_SEED = 2**63 - 1  # vLLM's range (an int64); wider seeds cannot seed a generator


class SLOBody(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ttft_ms: float = Field(gt=0, description="time to first token, milliseconds")
    tpot_ms: float = Field(gt=0, description="time per output token, milliseconds")


class _Common(BaseModel):
    # NaN and ±Infinity are refused in every number (they would poison the sampler, the SLO
    # arithmetic, or come back as invalid JSON).
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's default and range
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    # vLLM's extension: each choice carries the token ids it adds (one event per token), so
    # that a gateway in front (HFX's ``--engine openai``) relays exact tokens.
    return_token_ids: bool = False
    slo: SLOBody | None = None
    priority: int | None = Field(None, ge=0)
    task: str | None = None
    # Accepted only in their off form: an accepted parameter is never silently ignored.
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    echo: bool = False

    @model_validator(mode="after")
    def _unsupported(self) -> _Common:
        asked = [name for name in ("logprobs", "top_logprobs", "echo") if getattr(self, name)]
        if asked:
            raise ValueError(f"{', '.join(asked)}: not supported by this server")
        return self

    @property
    def stop_strings(self) -> list[str]:
        """The non-empty stop strings: an empty one would match at once, so it is ignored, the
        same in either form."""
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_Common):
    prompt: str | list[int] = Field(min_length=1)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content
                       if part.get("type") == "text")


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


def chat_prompt(messages: list[ChatMessage]) -> str:
    """ChatML, the template of the Qwen2 family, ending where the assistant's reply starts."""
    turns = "".join(f"<|im_start|>{m.role}\n{m.text}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


class APIError(Exception):
    """A request the gateway refuses: becomes an OpenAI-style error object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind)
        self.headers = headers or {}  # e.g. Retry-After on a 503

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}
