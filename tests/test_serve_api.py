"""The OpenAI-compatible API against a real server on 127.0.0.1 (the openai SDK and httpx)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from serve_helpers import MODEL, LiveServer, emulated, live_server
from sloserve.core.errors import SloserveError
from sloserve.core.request import RequestClass
from sloserve.serve.api import GatewaySettings
from sloserve.serve.backend import (
    Backend,
    GenerationRequest,
    ReplicaState,
    ServeError,
    TokenChunk,
)
from sloserve.serve.emulated import EmulatedBackend
from sloserve.serve.schemas import (
    CHAT_REPLY_PRIMING_TOKENS,
    CHAT_TOKENS_PER_MESSAGE,
    ChunkFactory,
    count_text_tokens,
    filler_text,
    sse,
)


class RecordingBackend(EmulatedBackend):
    """The emulated backend, remembering the last request the API handed it."""

    last: GenerationRequest | None = None

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        self.last = req
        async for c in super().generate(req):
            yield c


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(emulated(RecordingBackend)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def expected_text(n: int) -> str:
    return "".join(filler_text(i) for i in range(n))


def sse_events(resp: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE response, in order (blank-line separated)."""
    raw = resp.text
    assert raw.endswith("\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


def still_serves(server: LiveServer) -> None:
    r = httpx.post(
        f"{server.base_url}/completions",
        json={"model": MODEL, "prompt": "ok", "max_tokens": 2},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected_text(2)


# ----------------------------------------------------------------------------- the SDK
def test_sdk_completion_non_streaming(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="Hello there, world!", max_tokens=7)
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert out.model == MODEL
    (choice,) = out.choices
    assert choice.text == expected_text(7)
    assert choice.finish_reason == "length" and choice.index == 0 and choice.logprobs is None
    # "Hello there, world!" = Hello there , world ! (5) + BOS
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (6, 7)
    assert out.usage.total_tokens == 13


def test_sdk_completion_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL, prompt=[1, 2, 3, 4], max_tokens=5, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert len(chunks) == 6  # one per token, then the usage chunk
    ids = {c.id for c in chunks}
    assert len(ids) == 1
    texts = [c.choices[0].text for c in chunks[:5]]
    assert texts == [filler_text(i) for i in range(5)]
    assert [c.choices[0].finish_reason for c in chunks[:5]] == [None] * 4 + ["length"]
    assert all(c.usage is None for c in chunks[:5])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 5)


def test_sdk_chat_non_streaming(client: openai.OpenAI) -> None:
    messages: Any = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi."},
    ]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    (choice,) = out.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_text(4)
    assert choice.finish_reason == "length"
    n_prompt = CHAT_REPLY_PRIMING_TOKENS + 2 * CHAT_TOKENS_PER_MESSAGE
    n_prompt += count_text_tokens("You are terse.") + count_text_tokens("Say hi.")
    assert out.usage is not None and out.usage.prompt_tokens == n_prompt == 16
    assert out.usage.completion_tokens == 4


def test_sdk_chat_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert [c.choices[0].delta.content for c in chunks[1:]] == [filler_text(i) for i in range(3)]
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, "length"]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.usage is None for c in chunks)  # include_usage not asked


def test_raw_sse_format(server: LiveServer) -> None:
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "stream": True, "stream_options": {"include_usage": True},
        },
        timeout=10,
    )  # fmt: skip
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    assert [list(o) for o in objs] == [["id", "object", "created", "model", "choices", "usage"]] * 4
    assert objs[0]["choices"][0] == {
        "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
        "finish_reason": None,
    }  # fmt: skip
    assert objs[2]["choices"][0] == {
        "index": 0, "delta": {"content": filler_text(1)}, "logprobs": None,
        "finish_reason": "length",
    }  # fmt: skip
    assert objs[3]["choices"] == [] and objs[3]["usage"] == {
        "prompt_tokens": 3 + 3 + 1, "completion_tokens": 2, "total_tokens": 9,
    }  # fmt: skip


# ----------------------------------------------------------------------------- bad input
CTX = 4096  # llama-2-7b
_MSG = [{"role": "user", "content": "hi"}]
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


# ----------------------------------------------------------------------------- SLO inputs
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


# ----------------------------------------------------------------------------- endpoints
def test_models_health_openapi(server: LiveServer, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    r = httpx.get(f"{server.url}/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    schema = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"} <= set(
        schema["paths"]
    )
    props = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"slo", "qoe", "priority", "request_class", "stream_options"} <= set(props)
    r = httpx.get(f"{server.url}/nowhere", timeout=10)
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_metrics(server: LiveServer) -> None:
    httpx.post(
        f"{server.base_url}/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 3, "slo": {"ttft_ms": 0.001}},
        timeout=10,
    )
    httpx.post(
        f"{server.base_url}/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 3, "request_class": "be",
              "qoe": {"ttft_s": 5.0, "tokens_per_s": 1.0}},
        timeout=10,
    )  # fmt: skip
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    # a reader expecting the first token within 5 s at 1 token/s is served perfectly
    assert 'sloserve_request_qoe_bucket{class="be",le="0.99"} 0.0' in text
    assert 'sloserve_request_qoe_bucket{class="be",le="1.0"} 1.0' in text
    for name in (
        "sloserve_request_ttft_seconds_bucket", "sloserve_request_tpot_seconds_count",
        "sloserve_request_duration_seconds_sum", "sloserve_queue_size",
        'sloserve_requests_total{class="rt",status="ok"}',
        'sloserve_requests_total{class="rt",status="rejected"}',
        'sloserve_slo_violations_total{class="rt",kind="ttft"}',
        'sloserve_replica_running{replica="replica-0"}',
        'sloserve_replica_waiting{replica="replica-0"}',
        'sloserve_replica_kv_usage_ratio{replica="replica-0"}',
    ):  # fmt: skip
        assert name in text, name
    ok = next(
        line for line in text.splitlines()
        if line.startswith('sloserve_requests_total{class="rt",status="ok"}')
    )  # fmt: skip
    assert float(ok.split()[-1]) >= 1
    viol = next(
        line for line in text.splitlines()
        if line.startswith('sloserve_slo_violations_total{class="rt",kind="ttft"}')
    )  # fmt: skip
    assert float(viol.split()[-1]) >= 1  # a 1 µs TTFT target is always missed


# ----------------------------------------------------------------------------- overload
def test_queue_full_429() -> None:
    # R_max = 1: one request runs, one waits (max_queue=1), the third is dropped.
    from sloserve.experiments.runner import InstanceConfig

    icfg = InstanceConfig(profile="llama-2-7b@a100-80gb", max_running=1)
    with live_server(instance=icfg, max_queue=1, time_scale=1.0) as srv:
        url = f"{srv.base_url}/completions"
        long = {"model": MODEL, "prompt": "hi", "max_tokens": 100, "stream": True}
        # Response headers leave with the first token: the waiting one answers later.
        waiting = threading.Thread(target=lambda: httpx.post(url, json=long, timeout=30))
        with httpx.Client(timeout=10) as c1, c1.stream("POST", url, json=long) as r1:
            lines = r1.iter_lines()  # kept: a collected iterator closes the connection
            next(lines)  # the first is running
            waiting.start()
            deadline = time.monotonic() + 5
            while srv.backend.replicas()[0].waiting < 1:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            r3 = httpx.post(url, json={**long, "stream": False}, timeout=10)
            assert r3.status_code == 429
            assert r3.headers["retry-after"] == "1"
            assert r3.headers["x-sloserve-drop-reason"] == "queue_full"
            assert r3.json()["error"]["type"] == "rate_limit_error"
        waiting.join(timeout=30)
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert 'sloserve_requests_total{class="rt",status="dropped"} 1.0' in metrics


def test_client_disconnect_frees_kv(server: LiveServer) -> None:
    be = server.backend
    url = f"{server.base_url}/completions"
    body = {"model": MODEL, "prompt": "x " * 500, "max_tokens": 3000, "stream": True}
    with httpx.Client(timeout=10) as c, c.stream("POST", url, json=body) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # three events with their blank lines
        assert sum(1 for ln in got if ln.startswith("data: ")) == 3
        (state,) = be.replicas()
        assert state.running == 1 and state.kv_usage > 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        (state,) = be.replicas()
        if state.kv_usage == 0 and state.running == 0 and state.in_flight == 0:
            break
        time.sleep(0.01)
    assert (state.kv_usage, state.running, state.in_flight) == (0.0, 0, 0)
    assert isinstance(be, EmulatedBackend)
    (inst,) = be.instances()
    assert inst.done[-1].status.name == "ABORTED" and inst.done[-1].num_output_tokens < 3000
    inst.kv.check_invariants()
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'sloserve_requests_total{class="rt",status="cancelled"} 1.0' in text


# ----------------------------------------------------------------------------- faults
class FlakyBackend(Backend):
    """Two tokens, then a failure; unhealthy when ``down``."""

    name = "flaky"

    def __init__(self) -> None:
        self.down = False
        self.closed = 0

    async def start(self) -> None:
        pass

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        pass

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        if self.down:
            raise ServeError("no upstream is healthy", status=503, reason="no_backend")
        try:
            yield TokenChunk(" a", 1)
            yield TokenChunk(" b", 1)
            raise ServeError("upstream connection reset", status=502, reason="upstream_failed")
        finally:
            self.closed += 1

    def replicas(self) -> Sequence[ReplicaState]:
        return [ReplicaState("up", not self.down, 0, 0, float("nan"))]


def test_mid_stream_failure_and_no_backend() -> None:
    be = FlakyBackend()
    with live_server(be) as srv:
        url = f"{srv.base_url}/chat/completions"
        body = {"model": "any", "messages": _MSG, "stream": True}
        r = httpx.post(url, json=body, timeout=10)
        assert r.status_code == 200
        events = sse_events(r)
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])
        assert err["error"]["code"] == "upstream_failed" and "reset" in err["error"]["message"]
        assert [json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:3]] == [
            " a", " b",
        ]  # fmt: skip
        r = httpx.post(url, json={**body, "stream": False}, timeout=10)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_failed"
        be.down = True
        r = httpx.post(url, json=body, timeout=10)
        assert r.status_code == 503
        assert r.headers["x-sloserve-drop-reason"] == "no_backend"
        assert r.json()["error"]["type"] == "service_unavailable_error"
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 503
        assert be.closed == 2  # both accepted streams were closed
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert 'sloserve_requests_total{class="rt",status="error"} 2.0' in text
        assert 'sloserve_requests_total{class="rt",status="unavailable"} 1.0' in text


class BuggyBackend(FlakyBackend):
    """Two tokens, then an exception outside the contract (a bug in the backend)."""

    bug_first = False

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        if self.bug_first:
            raise KeyError("before the first token")
        try:
            yield TokenChunk(" a", 1)
            yield TokenChunk(" b", 1)
            raise KeyError("oops")
        finally:
            self.closed += 1


def test_a_backend_bug_mid_stream_still_ends_with_an_error_event() -> None:
    be = BuggyBackend()
    with live_server(be) as srv:
        body = {"model": "any", "prompt": "hi", "stream": True}
        r = httpx.post(f"{srv.base_url}/completions", json=body, timeout=10)
        events = sse_events(r)
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == "internal" and "KeyError" in err["message"]
        assert be.closed == 1
        # and the server still serves
        r = httpx.post(f"{srv.base_url}/completions", json={**body, "stream": False}, timeout=10)
        assert r.status_code == 500 and r.json()["error"]["message"]
        assert be.closed == 2
        be.bug_first = True  # and a bug before the first token
        r = httpx.post(f"{srv.base_url}/completions", json=body, timeout=10)
        assert r.status_code == 500 and r.json()["error"]["message"]
        # each request counted once, as an error (not cancelled, not missing)
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert 'sloserve_requests_total{class="rt",status="error"} 3.0' in text
        assert 'sloserve_requests_total{class="rt",status="cancelled"} 0.0' in text


def _shut_down_while_streaming(srv: Any, max_tokens: int) -> tuple[list[str], float]:
    """Stream one completion in a thread, shut the server down (what SIGTERM does) once
    the request is in flight, and return its SSE data lines and the seconds the stream
    took to end after the shutdown began."""
    result: dict[str, list[str]] = {}
    url = f"{srv.base_url}/completions"

    def client() -> None:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": max_tokens, "stream": True}
        with httpx.stream("POST", url, json=body, timeout=20) as r:
            result["events"] = [ln for ln in r.iter_lines() if ln.startswith("data: ")]

    t = threading.Thread(target=client)
    t.start()
    deadline = time.monotonic() + 5
    while not any(s.in_flight for s in srv.backend.replicas()):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    t0 = time.monotonic()
    srv.server.should_exit = True  # the context manager then joins the server
    t.join(timeout=20)
    return result["events"], time.monotonic() - t0


def test_graceful_shutdown_drains_streams() -> None:
    with live_server(time_scale=1.0) as srv:
        events, _ = _shut_down_while_streaming(srv, 60)
    assert events[-1] == "data: [DONE]" and len(events) == 61  # every token, then [DONE]


def test_shutdown_ends_undrained_streams_explicitly() -> None:
    with live_server(settings=GatewaySettings(drain_timeout_s=0.3), time_scale=1.0) as srv:
        events, took = _shut_down_while_streaming(srv, 3000)
        assert took < 3  # the drain timeout, not the 3000 tokens (30 s)
    assert events[-1] == "data: [DONE]"
    err = json.loads(events[-2][len("data: ") :])["error"]
    assert err["code"] == "shutdown" and "shutting down" in err["message"]
    assert 3 < len(events) - 2 < 3000  # some tokens, then the error


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("usage", [False, True])
def test_token_event_template_is_the_chunk(chat: bool, usage: bool) -> None:
    f = ChunkFactory("cmpl-1", 'mo"del\u00e9', chat, usage)
    for text in (" the", 'q"uote\\', "\u00e9\u4e2d\n"):
        assert f.token_event(text, None) == sse(f.token_chunk(text, None))
        assert json.loads(f.token_event(text, None)[6:]) == f.token_chunk(text, None)
    assert f.token_event(" x", "stop") == sse(f.token_chunk(" x", "stop"))


def test_server_side_pacing() -> None:
    """--pacing releases a stream at its qoe.tokens_per_s, never faster."""
    with live_server(settings=GatewaySettings(pacing=True)) as srv:
        body = {
            "model": MODEL, "prompt": "hi", "max_tokens": 8, "stream": True,
            "qoe": {"ttft_s": 0.0, "tokens_per_s": 50.0},
        }  # fmt: skip
        times: list[float] = []
        with httpx.stream("POST", f"{srv.base_url}/completions", json=body, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
        assert len(times) == 8
        gaps = np.diff(times)
        # 20 ms apart (the engine alone: ~0.5 ms at 20x). Receipt times jitter on a busy
        # machine (a late token makes the next gap short), so check the typical gap and the
        # span rather than every single gap.
        assert np.median(gaps) > 0.015
        assert sum(gaps) == pytest.approx(7 * 0.02, abs=0.05)
        # without a qoe spec, nothing is paced
        times.clear()
        del body["qoe"]
        with httpx.stream("POST", f"{srv.base_url}/completions", json=body, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
        assert times[-1] - times[0] < 0.1


# ----------------------------------------------------------------------------- the CLI
def test_cli_serve_process() -> None:
    """``python -m sloserve.cli serve`` answers streams, then SIGTERM stops it cleanly."""
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sloserve.cli", "serve", "--port", str(port), "--replicas", "2",
         "--policy", "sarathi", "--router", "round-robin", "--time-scale", "20",
         "--output-length", "uniform:3:6", "--max-running", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        for _ in range(2):
            messages: Any = _MSG
            chunks = list(
                client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=50, stream=True
                )
            )
            assert 3 <= len(chunks) - 1 <= 6 and chunks[-1].choices[0].finish_reason == "stop"
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'sloserve_replica_running{replica="replica-1"}' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal (the usual exit for a daemon)
    assert proc.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err, err
    assert "emulated llama-2-7b@a100-80gb x2, policy sarathi, router round-robin" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-5"], "unknown model 'gpt-5'"),
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--router", "nope"], "unknown router 'nope'"),
        (["--replicas", "0"], "replicas"),
        (["--time-scale", "-1"], "time_scale"),
        (["--output-length", "normal:3"], "--output-length"),
        (["--backend", "tgi"], "unknown --backend"),
        (["--backend", "openai"], "--upstream"),
        (["--backend", "openai", "--upstream", "ftp://x"], "not an http"),
        (["--slo-preset", "gold"], "slo_preset"),
        (["--admission", "maybe"], "admission"),
        (["--admission", "none", "--max-queue", "3"], "max_queue needs"),
        (["--drain-timeout", "inf"], "drain_timeout_s"),
    ],
)
def test_cli_serve_bad_options(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from sloserve.cli import app

    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code != 0
    assert isinstance(result.exception, SloserveError), result.output
    assert message in str(result.exception)


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_while_queued_leaves_the_engine(stream: bool) -> None:
    """A client that gives up before its first token (queued behind R_max) is removed from
    the engine's queue at once, not when its turn comes."""
    from sloserve.experiments.runner import InstanceConfig

    icfg = InstanceConfig(profile="llama-2-7b@a100-80gb", max_running=1)
    with live_server(instance=icfg, time_scale=1.0) as srv:
        be = srv.backend
        assert isinstance(be, EmulatedBackend)
        url = f"{srv.base_url}/completions"
        long = {"model": MODEL, "prompt": "hi", "max_tokens": 300, "stream": True}
        with httpx.Client(timeout=10) as c1, c1.stream("POST", url, json=long) as r1:
            lines = r1.iter_lines()
            next(lines)  # the first request runs (R_max = 1)
            with pytest.raises(httpx.ReadTimeout):  # the second waits, and its client leaves
                httpx.post(url, json={**long, "stream": stream}, timeout=0.3)
            deadline = time.monotonic() + 3
            while be.replicas()[0].waiting or be.replicas()[0].in_flight > 1:
                assert time.monotonic() < deadline, be.replicas()
                time.sleep(0.01)
            (inst,) = be.instances()
            (gone,) = inst.done
            assert gone.status.name == "ABORTED" and gone.num_output_tokens == 0
            assert inst.running[0].num_output_tokens < 300  # the first is still streaming
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert 'sloserve_requests_total{class="rt",status="cancelled"}' in text


def test_max_completion_tokens_and_defaults(server: LiveServer) -> None:
    url = f"{server.base_url}/chat/completions"
    r = httpx.post(
        url,
        json={"model": MODEL, "messages": _MSG, "max_completion_tokens": 2, "max_tokens": 9},
        timeout=10,
    )
    assert r.json()["usage"]["completion_tokens"] == 2  # the newer field wins
    r = httpx.post(
        f"{server.base_url}/completions", json={"model": MODEL, "prompt": "hi"}, timeout=10
    )
    assert r.json()["usage"]["completion_tokens"] == 16  # OpenAI's completions default
    r = httpx.post(url, json={"model": MODEL, "messages": _MSG}, timeout=10)
    assert r.json()["usage"]["completion_tokens"] == 256  # --default-max-tokens
    long = [{"role": "user", "content": "w " * 3950}]  # 3,956 prompt tokens of 4,096
    r = httpx.post(url, json={"model": MODEL, "messages": long}, timeout=10)
    assert r.json()["usage"]["completion_tokens"] == 4096 - 3956  # what the context leaves


# ----------------------------------------------------------------------------- follow-ups
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


class QueuedBackend(FlakyBackend):
    """Two replicas with waiting requests and a gateway queue of its own."""

    @property
    def queue_size(self) -> int:
        return 5

    def replicas(self) -> Sequence[ReplicaState]:
        return [ReplicaState("a", True, 1, 2, 0.5), ReplicaState("b", True, 1, 3, 0.5)]


def test_queue_size_metric_adds_the_gateway_queue() -> None:
    from sloserve.serve.metrics import GatewayMetrics

    text = GatewayMetrics(QueuedBackend()).render().decode()
    assert "\nsloserve_queue_size 10.0\n" in text  # 2 + 3 waiting at replicas + 5 queued
    text = GatewayMetrics(FlakyBackend()).render().decode()
    assert "\nsloserve_queue_size 0.0\n" in text


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats(server: LiveServer, chat: bool) -> None:
    """vLLM's continuous_usage_stats (guidellm sends it): running usage on every chunk."""
    path, prompt = (
        ("chat/completions", {"messages": [{"role": "user", "content": "hi there"}]})
        if chat
        else ("completions", {"prompt": "hi there"})
    )
    body: dict[str, Any] = {
        "model": MODEL, "max_tokens": 5, "stream": True, **prompt,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    r = httpx.post(f"{server.base_url}/{path}", json=body, timeout=10)
    assert r.status_code == 200
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    n_prompt = chunks[-1]["usage"]["prompt_tokens"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    counts = [c["usage"]["completion_tokens"] for c in chunks[:-1]]
    assert counts == ([0] if chat else []) + [1, 2, 3, 4, 5]
    for c in chunks:
        u = c["usage"]
        assert u["prompt_tokens"] == n_prompt
        assert u["total_tokens"] == n_prompt + u["completion_tokens"]
    # without include_usage it does nothing (as vLLM), and it is accepted
    body["stream_options"] = {"continuous_usage_stats": True}
    r = httpx.post(f"{server.base_url}/{path}", json=body, timeout=10)
    assert r.status_code == 200
    events = sse_events(r)
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_continuous_usage_template_is_the_chunk() -> None:
    f = ChunkFactory("cmpl-1", "m", False, True, continuous_usage=True, prompt_tokens=7)
    ev = json.loads(f.token_event(' "q"', None, 3)[6:])
    assert ev == {**f.token_chunk(' "q"', None), "usage": {
        "prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}  # fmt: skip
    assert json.loads(f.token_event("", "stop", 4)[6:])["usage"]["completion_tokens"] == 4


def test_cli_openai_backend_options(tmp_path: Any) -> None:
    """Every UpstreamConfig knob is reachable: --config YAML first, flags on top."""
    from sloserve.cli.serve import _upstream_backend

    cfg = tmp_path / "up.yaml"
    cfg.write_text("upstreams: [http://a:8000]\nretries: 5\nbreaker_open_s: 9\nread_timeout_s: 7\n")
    flags: dict[str, Any] = {
        "retries": 1, "breaker_failures": 4, "health_interval_s": 0.5,
        "connect_timeout_s": 0.25, "forward_priority": True, "forward_slo": True,
        "admission": None, "router": None,
    }  # fmt: skip
    be = _upstream_backend([], cfg, None, flags)
    c = be.config
    assert c.upstreams == ("http://a:8000",)
    assert (c.retries, c.breaker_failures, c.breaker_open_s) == (1, 4, 9.0)
    assert (c.health_interval_s, c.connect_timeout_s, c.read_timeout_s) == (0.5, 0.25, 7.0)
    assert c.forward_priority and c.forward_slo
    assert c.admission == "queue" and c.router == "least-loaded"  # the defaults agree
    be = _upstream_backend(["http://b:1"], None, "m", {"retries": None})
    assert be.config.upstreams == ("http://b:1",) and be.config.retries == 2
    assert be.config.models == ("m",)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--retries", "-1"], "retries"),
        (["--breaker-failures", "0"], "breaker_failures"),
        (["--read-timeout-s", "0"], "read_timeout_s"),
        (["--profile", "llama-2-7b@nowhere"], "unknown GPU"),
    ],
)
def test_cli_openai_bad_options(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from sloserve.cli import app

    result = CliRunner().invoke(
        app, ["serve", "--backend", "openai", "--upstream", "http://a:1", *args]
    )
    assert result.exit_code != 0
    assert isinstance(result.exception, SloserveError), result.output
    assert message in str(result.exception)


@pytest.mark.parametrize(("after", "header"), [(0.2, "1"), (1.0, "1"), (1.4, "2"), (2.5, "3")])
def test_retry_after_never_earlier_than_the_backend_asks(after: float, header: str) -> None:
    from sloserve.serve.api_errors import _serve_error

    e = _serve_error(ServeError("full", status=429, reason="queue_full", retry_after_s=after))
    assert e.headers["retry-after"] == header
    assert e.headers["x-sloserve-drop-reason"] == "queue_full"


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
