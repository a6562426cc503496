"""OpenAI request/response shapes for the gateway, prompt token counting and error bodies.

Request bodies are pydantic models (they also make the OpenAPI schema). Choices:

* **Unsupported OpenAI parameters** (``n`` > 1, ``best_of`` > 1, ``logprobs``,
  ``top_logprobs``, ``echo``, ``suffix``, ``tools``/``tool_choice``/``functions``,
  ``logit_bias``, a non-text ``response_format``, several prompts in one request, image
  content…) are rejected with a 400 that names them (:func:`unsupported_params`). Their
  neutral values (``n: 1``, ``logprobs: null``, ``tools: []``…) are accepted.
* **Sampling parameters** (``temperature``, ``top_p``, penalties, ``seed``, ``stop``, and
  vLLM's ``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``, ``min_tokens``) are
  validated and forwarded by the ``openai`` backend; the emulated backend does not sample
  (it streams deterministic filler) and rejects a non-empty ``stop`` it could not honour.
* **Unknown fields**: *strict* mode answers 400 naming them; *lenient* mode (the default,
  because benchmark clients send vendor fields) names them in a response header, never
  silently: ``x-sloserve-forwarded-params`` when the backend passes them on to its engines
  (the ``openai`` backend: vLLM's vendor fields keep working), ``x-sloserve-ignored-params``
  when it does not (the emulated backend; they are dropped from the request).
* ``stream_options.continuous_usage_stats`` (vLLM's; guidellm always sends it): with
  ``include_usage`` every chunk carries ``usage`` with the running counts (the role chunk
  0 completion tokens, each token chunk the tokens streamed so far); without
  ``include_usage`` it does nothing, as in vLLM.
* **Prompt tokens** are counted without a tokenizer: words and punctuation marks (regex
  ``\\w+|[^\\w\\s]``) plus one BOS token; a token-id prompt counts its ids; a chat adds 3
  tokens per message and 3 to prime the reply (OpenAI's published estimate). The count is
  what the emulated backend prefills and what ``usage.prompt_tokens`` reports.
* **Strict types** (as OpenAI and vLLM): every request model validates in pydantic's strict
  mode, so a number is a JSON number (``"10"`` is not an integer, ``true`` is not an
  integer, ``10.0`` is not an integer; a float field takes an integer) and a boolean is
  ``true``/``false`` (``"yes"`` and ``1`` are refused); floats are finite. Every integer has
  bounds an engine can hold (:data:`INT64_MIN`…:data:`INT64_MAX` for ``seed`` and
  ``priority``, :data:`TOKEN_MAX` for token counts and ids, OpenAI's limits for ``n``,
  ``best_of``, ``logprobs``, ``top_logprobs``); the API then checks token counts against
  the model's context. The bounds live here, next to each field, and reach the OpenAPI
  schema; :func:`request_bounds` lists them.
* **Chat messages follow OpenAI's content rule**: a ``system``, ``developer``, ``user`` or
  ``tool`` message needs ``content``; an ``assistant`` message may leave it null only when
  it carries ``tool_calls`` (or the legacy ``function_call``).
"""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

TOKEN_PATTERN = re.compile(r"\w+|[^\w\s]")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
"""``seed`` and ``priority`` are int64 in vLLM's engine (and numpy/torch seeds)."""
TOKEN_MAX = 2**31 - 1
"""Token counts and token ids: int32, what vLLM's engine holds them in (the model's context
is far smaller and is checked per request)."""
MS_MAX = 86_400_000.0
"""Latency targets: at most a day (in milliseconds)."""

TokenId = Annotated[int, Field(ge=0, le=TOKEN_MAX)]

_STRICT = ConfigDict(strict=True, allow_inf_nan=False)
"""Request models: JSON types as declared (no "10" for 10, no "yes" for true), finite
floats."""
CHAT_TOKENS_PER_MESSAGE = 3
CHAT_REPLY_PRIMING_TOKENS = 3

FILLER_WORDS = (
    " the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", " and",
    " runs", " far", " away", " into", " green", " hills",
)  # fmt: skip
"""The emulated backend's deterministic output: token ``i`` is ``FILLER_WORDS[i % 16]``
(each one token by :data:`TOKEN_PATTERN`)."""


def count_text_tokens(text: str) -> int:
    """Tokens of ``text`` (words and punctuation marks), without a BOS token."""
    return len(TOKEN_PATTERN.findall(text))


def filler_text(index: int) -> str:
    """The text of generated token ``index`` (0-based)."""
    return FILLER_WORDS[index % len(FILLER_WORDS)]


# ----------------------------------------------------------------------------- SLO inputs
class SloBody(BaseModel):
    """Per-request latency targets (milliseconds)."""

    # finite: Python's JSON parser reads NaN and Infinity
    model_config = ConfigDict(extra="forbid", **_STRICT)

    ttft_ms: float | None = Field(default=None, gt=0, le=MS_MAX, description="time to first token")
    tpot_ms: float | None = Field(
        default=None, gt=0, le=MS_MAX, description="mean time per output token"
    )
    deadline_ms: float | None = Field(default=None, gt=0, le=MS_MAX, description="end-to-end bound")


class QoEBody(BaseModel):
    """Andes' expected consumption timeline: first token after ``ttft_s``, then
    ``tokens_per_s`` (the user's reading speed; also the server-side pacer's rate)."""

    # finite: an infinite target makes the QoE NaN (and a NaN poisons the histogram's sum)
    model_config = ConfigDict(extra="forbid", **_STRICT)

    ttft_s: float = Field(ge=0, le=86_400)
    tokens_per_s: float = Field(gt=0, le=1e6)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", **_STRICT)

    include_usage: bool = False
    continuous_usage_stats: bool = False
    """vLLM's running usage on every chunk (with ``include_usage``; alone it does nothing,
    as in vLLM)."""


# ----------------------------------------------------------------------------- requests
class _Common(BaseModel):
    """Fields both endpoints share. Unknown fields land in ``model_extra``."""

    model_config = ConfigDict(extra="allow", **_STRICT)

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=TOKEN_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    user: str | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1, le=128)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    # vLLM's sampling extras (accepted: benchmark clients send them)
    top_k: int | None = Field(default=None, ge=-1, le=TOKEN_MAX, description="-1 or 0: off")
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(default=None, ge=0, le=TOKEN_MAX)
    # SLO inputs
    priority: int | None = Field(
        default=None, ge=INT64_MIN, le=INT64_MAX, description="lower is served first (vLLM)"
    )
    slo: SloBody | None = None
    qoe: QoEBody | None = None
    request_class: Literal["rt", "be"] | None = None


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    best_of: int | None = Field(default=None, ge=1, le=128)
    echo: bool | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(
        cls, v: str | list[int] | list[str] | list[list[int]]
    ) -> str | list[int] | list[str] | list[list[int]]:
        if isinstance(v, list) and (not v or any(isinstance(x, list) and not x for x in v)):
            raise ValueError("a prompt must not be empty")
        return v


class ChatMessage(BaseModel):
    """One chat message; ``content`` may be null only on an assistant message with
    ``tool_calls`` (or ``function_call``), as OpenAI's API has it."""

    model_config = ConfigDict(extra="allow", **_STRICT)

    # declared before content: its validator reads them
    role: Literal["system", "developer", "user", "assistant", "tool"]
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = Field(default=None, validate_default=True)

    @field_validator("content")
    @classmethod
    def _content(
        cls, v: str | list[dict[str, Any]] | None, info: ValidationInfo
    ) -> str | list[dict[str, Any]] | None:
        if v is not None:
            return v
        role = info.data.get("role")
        if role is None:  # the role itself is invalid: that error is the one to report
            return v
        if role != "assistant":
            raise ValueError(f"a {role} message needs content (a string or a list of parts)")
        if not info.data.get("tool_calls") and not info.data.get("function_call"):
            raise ValueError("an assistant message needs content unless it has tool_calls")
        return v


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=TOKEN_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


AnyRequest = CompletionRequest | ChatCompletionRequest

SLO_HEADERS = ("x-slo-ttft-ms", "x-slo-tpot-ms", "x-slo-e2e-ms", "x-request-class")


def request_bounds() -> dict[str, dict[str, tuple[Any, Any]]]:
    """Every bounded numeric field of the request models: ``{model: {field: (low, high)}}``
    (``None`` where a side is open; for the docs and the closing report)."""
    out: dict[str, dict[str, tuple[Any, Any]]] = {}
    for model in (CompletionRequest, ChatCompletionRequest, ChatMessage, StreamOptions,
                  SloBody, QoEBody):  # fmt: skip
        fields: dict[str, tuple[Any, Any]] = {}
        for name, f in model.model_fields.items():
            low = high = None
            for m in f.metadata:
                low = getattr(m, "ge", None) if getattr(m, "ge", None) is not None else low
                low = getattr(m, "gt", None) if getattr(m, "gt", None) is not None else low
                high = getattr(m, "le", None) if getattr(m, "le", None) is not None else high
            if low is not None or high is not None:
                fields[name] = (low, high)
        out[model.__name__] = fields
    return out


def unsupported_params(body: AnyRequest) -> list[str]:
    """Names of OpenAI parameters in ``body`` with a value this gateway cannot honour."""
    bad: list[str] = []
    if body.stream_options is not None and not body.stream:
        bad.append("stream_options (only with stream: true)")
    if body.n not in (None, 1):
        bad.append("n")
    if body.logit_bias:
        bad.append("logit_bias")
    if isinstance(body, CompletionRequest):
        if body.best_of not in (None, 1):
            bad.append("best_of")
        if body.echo:
            bad.append("echo")
        if body.logprobs is not None:
            bad.append("logprobs")
        if body.suffix:
            bad.append("suffix")
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)) and len(p) > 1:
            bad.append("prompt (more than one prompt)")
    else:
        if body.logprobs:
            bad.append("logprobs")
        if body.top_logprobs:
            bad.append("top_logprobs")
        if body.tools:
            bad.append("tools")
        if body.tool_choice not in (None, "none"):
            bad.append("tool_choice")
        if body.functions:
            bad.append("functions")
        if body.function_call not in (None, "none"):
            bad.append("function_call")
        rf = body.response_format
        if rf is not None and rf.get("type", "text") != "text":
            bad.append("response_format")
        for i, m in enumerate(body.messages):
            if isinstance(m.content, list):
                for part in m.content:
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        bad.append(f"messages[{i}].content (only text parts)")
                        break
    return bad


def prompt_tokens(body: AnyRequest) -> int:
    """Prompt length in tokens (see the module docstring for the counting rule)."""
    if isinstance(body, CompletionRequest):
        p = body.prompt
        if isinstance(p, str):
            return count_text_tokens(p) + 1
        if p and isinstance(p[0], str):
            return count_text_tokens(p[0]) + 1
        if p and isinstance(p[0], list):
            return max(1, len(p[0]))
        return max(1, len(p))
    total = CHAT_REPLY_PRIMING_TOKENS
    for m in body.messages:
        total += CHAT_TOKENS_PER_MESSAGE
        if isinstance(m.content, str):
            total += count_text_tokens(m.content)
        elif m.content:
            total += sum(count_text_tokens(str(part.get("text", ""))) for part in m.content)
    return total


def requested_max_tokens(body: AnyRequest) -> int | None:
    """The client's cap on output tokens (``max_completion_tokens`` wins for chat)."""
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        return body.max_completion_tokens
    return body.max_tokens


# ----------------------------------------------------------------------------- responses
def error_body(
    message: str, type_: str = "invalid_request_error", param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


_json_str = json.encoder.encode_basestring_ascii
"""The C string encoder behind ``json.dumps(str)`` (the same output, without the dispatch)."""


class ChunkFactory:
    """Builds the exact OpenAI objects of one response (ids, ``created``, model fixed).

    The hot path, :meth:`token_event` (one SSE event per token), splices the token's text
    (and with continuous usage the running counts) into a template encoded once per
    stream: the same bytes as ``sse(token_chunk(text, None))`` without building a dict.
    """

    __slots__ = (
        "_prefix", "_suffix", "_usage_head", "chat", "continuous_usage", "created", "id",
        "include_usage", "model", "prompt_tokens",
    )  # fmt: skip

    def __init__(
        self, request_id: str, model: str, chat: bool, include_usage: bool,
        continuous_usage: bool = False, prompt_tokens: int = 0,
    ) -> None:  # fmt: skip
        self.id = request_id
        self.model = model
        self.chat = chat
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage and include_usage
        """vLLM's ``continuous_usage_stats``: ``usage`` with the running counts on every
        chunk (only with ``include_usage``, as vLLM)."""
        self.prompt_tokens = prompt_tokens
        self.created = int(time.time())
        head = json.dumps(self._base(), separators=(",", ":"))[:-1]
        field = '"delta":{"content":' if chat else '"text":'
        self._prefix = f'data: {head},"choices":[{{"index":0,{field}'
        close = ("}" if chat else "") + ',"logprobs":null,"finish_reason":null}]'
        self._usage_head = f'{close},"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":'
        self._suffix = close + (',"usage":null' if include_usage else "") + "}\n\n"

    def token_event(self, text: str, finish_reason: str | None, completion: int = 0) -> str:
        """The SSE event (``data: …``) of one token chunk; ``completion`` is the number of
        tokens streamed so far, this one included (used with continuous usage)."""
        if finish_reason is None and text:
            if self.continuous_usage:
                return (
                    f"{self._prefix}{_json_str(text)}{self._usage_head}{completion},"
                    f'"total_tokens":{self.prompt_tokens + completion}}}}}\n\n'
                )
            return self._prefix + _json_str(text) + self._suffix
        out = self.token_chunk(text, finish_reason)
        if self.continuous_usage:
            out["usage"] = usage(self.prompt_tokens, completion)
        return sse(out)

    def role_event(self) -> str:
        """The SSE event of the chat role chunk."""
        out = self.role_chunk()
        if self.continuous_usage:
            out["usage"] = usage(self.prompt_tokens, 0)
        return sse(out)

    def _base(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
        }
        return out

    def role_chunk(self) -> dict[str, Any]:
        """Chat streams open with the assistant role and empty content."""
        out = self._base()
        out["choices"] = [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        if self.include_usage:
            out["usage"] = None
        return out

    def token_chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        out = self._base()
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": text} if text else {},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        out["choices"] = [choice]
        if self.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, prompt: int, completion: int) -> dict[str, Any]:
        """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
        out = self._base()
        out["choices"] = []
        out["usage"] = usage(prompt, completion)
        return out

    def full(self, text: str, finish_reason: str, prompt: int, completion: int) -> dict[str, Any]:
        """The non-streaming response."""
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            obj = "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(prompt, completion),
        }
