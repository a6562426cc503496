"""Request validation at the gateway on 127.0.0.1: bad inputs answered 400/404 with an
OpenAI error body and counted once as rejected (under the header's class), unknown
fields ignored, forwarded or refused (strict mode), and where a request's SLO comes
from (body over headers over class defaults)."""

# ruff: noqa: F811 - the fixtures imported from serve_helpers are test parameters

from __future__ import annotations

from typing import Any

import httpx
import pytest

from serve_helpers import (  # noqa: F401  (server: fixtures)
    _MSG,
    MODEL,
    LiveServer,
    RecordingBackend,
    emulated,
    expected_text,
    live_server,
    server,
)
from sloserve.core.request import RequestClass
from sloserve.serve.api import GatewaySettings
from sloserve.serve.backend import GenerationRequest
from sloserve.serve.emulated import EmulatedBackend

CTX = 4096  # llama-2-7b


BAD_INPUTS: list[tuple[str, str, Any, dict[str, str], int, str | None]] = [
    # (id, endpoint, body, headers, status, param)
    ("malformed-json", "completions", b'{"model": "x", "prompt": ', {}, 400, None),
    ("not-an-object", "completions", b"[1, 2]", {}, 400, None),
    ("missing-model", "completions", {"prompt": "hi"}, {}, 400, "model"),
    ("missing-messages", "chat/completions", {"model": MODEL}, {}, 400, "messages"),
    ("empty-messages", "chat/completions", {"model": MODEL, "messages": []}, {}, 400, "messages"),
    ("bad-role", "chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "x"}, {"role": "wizard"}]}, {},
     400, "messages[1].role"),
    ("prompt-wrong-type", "completions", {"model": MODEL, "prompt": 5}, {}, 400, "prompt"),
    ("prompt-empty-ids", "completions", {"model": MODEL, "prompt": []}, {}, 400, "prompt"),
    ("prompt-negative-id", "completions", {"model": MODEL, "prompt": [3, -1]}, {}, 400,
     "prompt"),
    ("stream-options-no-stream", "completions",
     {"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}}, {}, 400,
     "stream_options"),
    ("negative-max-tokens", "completions",
     {"model": MODEL, "prompt": "hi", "max_tokens": -5}, {}, 400, "max_tokens"),
    ("zero-max-tokens", "chat/completions",
     {"model": MODEL, "messages": _MSG, "max_tokens": 0}, {}, 400, "max_tokens"),
    ("huge-max-tokens", "completions",
     {"model": MODEL, "prompt": "hi", "max_tokens": 10**9}, {}, 400, "max_tokens"),
    ("max-tokens-string", "completions",
     {"model": MODEL, "prompt": "hi", "max_tokens": "lots"}, {}, 400, "max_tokens"),
    ("prompt-over-context", "completions",
     {"model": MODEL, "prompt": "word " * CTX, "max_tokens": 1}, {}, 400, "prompt"),
    ("prompt-ids-over-context", "completions",
     {"model": MODEL, "prompt": list(range(CTX - 5)), "max_tokens": 10}, {}, 400, "max_tokens"),
    ("chat-over-context", "chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "w " * CTX}]}, {}, 400,
     "messages"),
    ("slo-wrong-type", "completions",
     {"model": MODEL, "prompt": "hi", "slo": {"ttft_ms": "fast"}}, {}, 400, "slo.ttft_ms"),
    ("slo-negative", "completions",
     {"model": MODEL, "prompt": "hi", "slo": {"tpot_ms": -1}}, {}, 400, "slo.tpot_ms"),
    ("slo-unknown-key", "completions",
     {"model": MODEL, "prompt": "hi", "slo": {"ttft": 5}}, {}, 400, "slo.ttft"),
    ("slo-not-object", "completions",
     {"model": MODEL, "prompt": "hi", "slo": 200}, {}, 400, "slo"),
    ("qoe-zero-speed", "chat/completions",
     {"model": MODEL, "messages": _MSG, "qoe": {"ttft_s": 1, "tokens_per_s": 0}}, {}, 400,
     "qoe.tokens_per_s"),
    ("bad-class", "completions",
     {"model": MODEL, "prompt": "hi", "request_class": "gold"}, {}, 400, "request_class"),
    ("bad-class-header", "completions",
     {"model": MODEL, "prompt": "hi"}, {"x-request-class": "gold"}, 400, "x-request-class"),
    ("bad-slo-header", "completions",
     {"model": MODEL, "prompt": "hi"}, {"x-slo-ttft-ms": "soon"}, 400, "x-slo-ttft-ms"),
    ("n-2", "completions", {"model": MODEL, "prompt": "hi", "n": 2}, {}, 400, "n"),
    ("best-of", "completions", {"model": MODEL, "prompt": "hi", "best_of": 3}, {}, 400, "best_of"),
    ("logprobs", "chat/completions",
     {"model": MODEL, "messages": _MSG, "logprobs": True}, {}, 400, "logprobs"),
    ("tools", "chat/completions",
     {"model": MODEL, "messages": _MSG, "tools": [{"type": "function"}]}, {}, 400, "tools"),
    ("echo", "completions", {"model": MODEL, "prompt": "hi", "echo": True}, {}, 400, "echo"),
    ("several-prompts", "completions",
     {"model": MODEL, "prompt": ["a", "b"]}, {}, 400, "prompt"),
    ("image-content", "chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, {},
     400, "messages[0].content"),
    ("stop-emulated", "completions",
     {"model": MODEL, "prompt": "hi", "stop": ["\n"]}, {}, 400, "stop"),
    ("temperature-range", "completions",
     {"model": MODEL, "prompt": "hi", "temperature": 9}, {}, 400, "temperature"),
    ("unknown-model", "completions", {"model": "gpt-9", "prompt": "hi"}, {}, 404, "model"),
    ("max-completion-tokens-over-context", "chat/completions",
     {"model": MODEL, "messages": _MSG, "max_completion_tokens": CTX}, {}, 400,
     "max_completion_tokens"),
    # Python's JSON reads Infinity: an infinite QoE target made the QoE NaN, and one NaN
    # observation turns the histogram's _sum into NaN for good
    ("qoe-infinite", "completions",
     b'{"model": "llama-2-7b", "prompt": "hi", "qoe": {"ttft_s": Infinity, "tokens_per_s": 1}}',
     {}, 400, "qoe.ttft_s"),
    ("slo-infinite", "completions",
     b'{"model": "llama-2-7b", "prompt": "hi", "slo": {"deadline_ms": Infinity}}', {}, 400,
     "slo.deadline_ms"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("endpoint", "body", "headers", "status", "param"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUTS],
)
def test_bad_input(
    server: LiveServer, endpoint: str, body: Any, headers: dict[str, str], status: int,
    param: str | None,
) -> None:  # fmt: skip
    url = f"{server.base_url}/{endpoint}"
    if isinstance(body, bytes):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=10)
    else:
        r = httpx.post(url, json=body, headers=headers, timeout=10)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param, err
        assert param.split(".")[-1].split("[")[0] in err["message"] or err["code"] in (
            "context_length_exceeded",
            "model_not_found",
        )


def still_serves(server: LiveServer) -> None:
    r = httpx.post(
        f"{server.base_url}/completions",
        json={"model": MODEL, "prompt": "ok", "max_tokens": 2},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected_text(2)


def _rejected(server: LiveServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    line = next(
        ln for ln in text.splitlines()
        if ln.startswith('sloserve_requests_total{class="rt",status="rejected"}')
    )  # fmt: skip
    return float(line.split()[-1])


def test_server_survives_bad_input(server: LiveServer) -> None:
    before = _rejected(server)
    for case in BAD_INPUTS[:3]:
        body = case[2]
        kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
        httpx.post(f"{server.base_url}/{case[1]}", timeout=10, **kw)
    assert _rejected(server) == before + 3  # each counted once
    still_serves(server)


def test_rejections_are_counted_under_the_header_class(server: LiveServer) -> None:
    """A best-effort client (x-request-class: be) whose request is refused is counted as
    be, not as the default rt."""

    def be_rejected() -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        line = next(
            ln for ln in text.splitlines()
            if ln.startswith('sloserve_requests_total{class="be",status="rejected"}')
        )  # fmt: skip
        return float(line.split()[-1])

    before = be_rejected()
    hdr = {"x-request-class": "BE"}
    url = f"{server.base_url}/completions"
    assert httpx.post(url, json={"model": "gpt-9", "prompt": "hi"}, headers=hdr).status_code == 404
    assert httpx.post(url, json={"model": MODEL, "prompt": 5}, headers=hdr).status_code == 400
    assert be_rejected() == before + 2


def test_unknown_fields_lenient_then_strict(server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "vendor_knob": 3, "zeta": None}
    r = httpx.post(f"{server.base_url}/completions", json=body, timeout=10)
    assert r.status_code == 200
    assert r.headers["x-sloserve-ignored-params"] == "vendor_knob,zeta"
    odd = {**body, "ā": 1, **{f"k{i:02}": i for i in range(20)}}
    r = httpx.post(f"{server.base_url}/completions", json=odd, timeout=10)
    assert r.status_code == 200
    assert r.headers["x-sloserve-ignored-params"].startswith("k00,k01,")
    assert r.headers["x-sloserve-ignored-params"].endswith(",k15,+7 more")
    odd = {**body, "ā": 1}
    r = httpx.post(f"{server.base_url}/completions", json=odd, timeout=10)
    assert r.headers["x-sloserve-ignored-params"] == "vendor_knob,zeta,%C4%81"
    with live_server(settings=GatewaySettings(strict=True)) as strict:
        r = httpx.post(f"{strict.base_url}/completions", json=body, timeout=10)
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "vendor_knob" and "vendor_knob, zeta" in err["message"]
        ok = {k: v for k, v in body.items() if k not in ("vendor_knob", "zeta")}
        assert httpx.post(f"{strict.base_url}/completions", json=ok, timeout=10).status_code == 200


class ForwardingRecorder(RecordingBackend):
    """A backend that passes unknown fields on (as the ``openai`` proxy does)."""

    forwards_unknown_params = True


@pytest.mark.parametrize("forwards", [False, True])
def test_unknown_fields_forwarded_or_ignored(forwards: bool) -> None:
    """Lenient mode: the header says what happens to unknown fields, and it is true."""
    be = emulated(ForwardingRecorder if forwards else RecordingBackend)
    assert isinstance(be, RecordingBackend)
    with live_server(backend=be) as srv:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "vendor_knob": 3, "top_k": 5}
        r = httpx.post(f"{srv.base_url}/completions", json=body, timeout=10)
        assert r.status_code == 200
        assert be.last is not None
        sent = be.last.body
        assert sent["top_k"] == 5  # a declared (vLLM) field: always in the body
        if forwards:
            assert r.headers["x-sloserve-forwarded-params"] == "vendor_knob"
            assert "x-sloserve-ignored-params" not in r.headers
            assert sent["vendor_knob"] == 3
        else:
            assert r.headers["x-sloserve-ignored-params"] == "vendor_knob"
            assert "x-sloserve-forwarded-params" not in r.headers
            assert "vendor_knob" not in sent


def test_openai_backend_forwards_unknown_params() -> None:
    from sloserve.serve.upstream import OpenAIUpstreamBackend

    assert OpenAIUpstreamBackend.forwards_unknown_params
    assert not EmulatedBackend.forwards_unknown_params


def test_slo_inputs_precedence(server: LiveServer) -> None:
    be = server.backend
    assert isinstance(be, RecordingBackend)

    def last() -> GenerationRequest:
        assert be.last is not None
        return be.last

    url = f"{server.base_url}/completions"
    base = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    # class defaults (bros preset): rt gets TTFT 0.4 s / TPOT 0.2 s, be nothing
    httpx.post(url, json=base, timeout=10)
    assert last().request_class is RequestClass.RT
    assert (last().slo.ttft_s, last().slo.tpot_s, last().slo.deadline_s) == (0.4, 0.2, None)
    httpx.post(url, json=base, headers={"x-request-class": "be"}, timeout=10)
    assert last().request_class is RequestClass.BE and last().slo.empty
    # headers over class defaults, body over headers, field by field
    httpx.post(
        url,
        json={**base, "slo": {"tpot_ms": 50, "deadline_ms": 9000}, "priority": -3,
              "qoe": {"ttft_s": 1.0, "tokens_per_s": 5}, "request_class": "rt"},
        headers={"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "80", "x-request-class": "be"},
        timeout=10,
    )  # fmt: skip
    got = last()
    assert got.request_class is RequestClass.RT and got.priority == -3
    assert (got.slo.ttft_s, got.slo.tpot_s, got.slo.deadline_s) == (0.25, 0.05, 9.0)
    assert got.qoe is not None and (got.qoe.ttft_s, got.qoe.tokens_per_s) == (1.0, 5.0)
    assert got.deadline == pytest.approx(got.arrival + 9.0)
