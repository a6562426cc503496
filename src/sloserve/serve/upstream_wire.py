"""What the ``openai`` backend sends to and reads from an OpenAI-compatible upstream.

The request body's sloserve fields (:func:`sloserve_fields`, forwarded only to sloserve
upstreams) and the parsing of the streamed chunks: one SSE ``data`` payload into its text,
finish reason and usage (:func:`_parse_event`), the usage's token counts (:func:`_count`).
Anything malformed raises :class:`_UpstreamFailed`: the upstream's fault, never the
request's, so the backend counts it and may retry elsewhere.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sloserve.serve.backend import (
    FinishReason,
    GenerationRequest,
)

SLOSERVE_BODY_FIELDS = ("slo", "qoe", "request_class", "priority")
"""Body fields that are sloserve's extensions: never forwarded as such to an engine."""


class _UpstreamFailed(Exception):
    """An upstream failed a request (its fault, not the request's): count it, maybe retry."""


def sloserve_fields(req: GenerationRequest) -> dict[str, Any]:
    """The request's class, SLO and QoE as sloserve's body fields (what the gateway resolved
    from the body, the ``x-slo-*`` headers and the class defaults)."""

    def ms(s: float | None) -> float | None:
        return None if s is None else s * 1e3

    out: dict[str, Any] = {"request_class": req.request_class.value}
    slo = {"ttft_ms": ms(req.slo.ttft_s), "tpot_ms": ms(req.slo.tpot_s)}
    slo["deadline_ms"] = ms(req.slo.deadline_s)
    slo = {k: v for k, v in slo.items() if v is not None}
    if slo:
        out["slo"] = slo
    if req.qoe is not None:
        out["qoe"] = {"ttft_s": req.qoe.ttft_s, "tokens_per_s": req.qoe.tokens_per_s}
    return out


def _finish(reason: Any) -> FinishReason:
    return "length" if reason == "length" else "abort" if reason == "abort" else "stop"


def _parse_event(data: str) -> tuple[str, FinishReason | None, dict[str, Any] | None]:
    """Text, finish reason and usage of one SSE ``data`` payload of a streamed completion
    or chat completion. Anything that is not such a chunk (an error event, JSON of another
    shape) raises _UpstreamFailed: the upstream's fault, never an unhandled exception."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as e:
        raise _UpstreamFailed(f"bad SSE data {data[:80]!r}") from e
    if not isinstance(obj, dict):
        raise _UpstreamFailed(f"SSE data is not a chunk object: {data[:80]!r}")
    if "error" in obj or obj.get("object") == "error":
        raise _UpstreamFailed(f"error event: {data[:200]}")
    usage = obj.get("usage")
    text = ""
    finish: FinishReason | None = None
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        raise _UpstreamFailed(f"bad choices in {data[:80]!r}")
    for choice in choices:
        if not isinstance(choice, dict):
            raise _UpstreamFailed(f"bad choice in {data[:80]!r}")
        delta = choice.get("delta")
        if delta is not None and not isinstance(delta, dict):
            raise _UpstreamFailed(f"bad delta in {data[:80]!r}")
        piece = delta.get("content") if delta is not None else choice.get("text")
        if piece is not None and not isinstance(piece, str):
            raise _UpstreamFailed(f"non-text content in {data[:80]!r}")
        text += piece or ""
        if choice.get("finish_reason") is not None:
            finish = _finish(choice["finish_reason"])
    # Usage is advisory (it corrects the token count): a malformed one is ignored.
    return text, finish, usage if isinstance(usage, dict) and usage else None


def _count(usage: dict[str, Any] | None, key: str) -> int | None:
    """A non-negative integer count from ``usage``, or None when absent or malformed."""
    v = None if usage is None else usage.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        return None
    return int(v)
