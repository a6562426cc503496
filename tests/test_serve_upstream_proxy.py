"""The ``openai`` upstream backend as a proxy, against fake OpenAI-compatible engines on
127.0.0.1 (``serve_helpers.FakeEngine``): the body it forwards (streaming with usage;
priority and SLO fields only when asked), the tokens and usage it reads back from
completion and chat streams, a client that goes away, and malformed chunks or usage."""

# ruff: noqa: F811 - the fixtures imported from serve_helpers are test parameters

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from serve_helpers import (  # noqa: F401  (engines, fakes: fixtures)
    collect,
    engines,
    fakes,
    greq,
    run_backend,
)
from sloserve.core.request import SLO, RequestClass
from sloserve.serve.backend import ServeError
from sloserve.serve.breaker import BreakerState
from sloserve.serve.upstream import OpenAIUpstreamBackend
from sloserve.serve.upstream_config import UpstreamConfig


def test_completions_stream_tokens_usage_and_forwarded_body(fakes: Any) -> None:
    (url, fe), _ = fakes
    cfg = UpstreamConfig(upstreams=(url,), health_interval_s=0)
    body = {
        "model": "fake-model",
        "prompt": "hi",
        "slo": {"ttft_ms": 100},
        "priority": 3,
        "stream": False,
    }
    chunks = run_backend(cfg, lambda b: collect(b, greq(body=body, priority=3)))
    assert [c.text for c in chunks] == ["t", "t", "t", "t", ""]
    assert [c.num_tokens for c in chunks] == [1, 1, 1, 1, 0]
    assert chunks[-1].finish_reason == "length" and chunks[-1].prompt_tokens == 7
    sent = fe.bodies[-1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert "slo" not in sent and "priority" not in sent
    assert sent["max_tokens"] == 4 and sent["prompt"] == "hi"
    # With forward_priority the engine gets the request's priority.
    cfg = UpstreamConfig(upstreams=(url,), health_interval_s=0, forward_priority=True)
    run_backend(cfg, lambda b: collect(b, greq(body=body, priority=3)))
    assert fe.bodies[-1]["priority"] == 3


def test_chat_deltas_and_usage_correction(fakes: Any) -> None:
    (url, fe), _ = fakes
    fe.tokens, fe.tokens_per_chunk = 8, 2  # 4 chunks of 2 tokens; usage says 8
    cfg = UpstreamConfig(upstreams=(url,), health_interval_s=0)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    chunks = run_backend(cfg, lambda b: collect(b, greq(endpoint="chat.completions", body=body)))
    assert "".join(c.text for c in chunks) == "t" * 8
    assert sum(c.num_tokens for c in chunks) == 8
    assert chunks[-1].num_tokens == 4 and chunks[-1].finish_reason == "length"


def test_forward_slo_fields_to_sloserve_upstreams(fakes: Any) -> None:
    from sloserve.core.request import QoESpec

    (u1, f1), _ = fakes
    r = greq(slo=SLO(ttft_s=0.25, deadline_s=4.0), cls=RequestClass.BE)
    r.qoe = QoESpec(1.0, 5.0)
    r.body = {"model": "fake-model", "prompt": "hi", "slo": {"ttft_ms": 999}}
    run_backend(UpstreamConfig(upstreams=(u1,), health_interval_s=0), lambda b: collect(b, r))
    assert not {"slo", "qoe", "request_class"} & set(f1.bodies[-1])
    cfg = UpstreamConfig(upstreams=(u1,), health_interval_s=0, forward_slo=True)
    run_backend(cfg, lambda b: collect(b, r))
    sent = f1.bodies[-1]
    # What the gateway resolved (body, headers, class defaults), not the raw body field.
    assert sent["slo"] == {"ttft_ms": 250.0, "deadline_ms": 4000.0}
    assert sent["qoe"] == {"ttft_s": 1.0, "tokens_per_s": 5.0}
    assert sent["request_class"] == "be"


def test_stream_without_finish_reason_is_an_error(fakes: Any) -> None:
    (u1, f1), _ = fakes
    f1.mode = "no_finish"
    cfg = UpstreamConfig(upstreams=(u1,), retries=0, health_interval_s=0)
    with pytest.raises(ServeError, match="without a finish reason"):
        run_backend(cfg, lambda b: collect(b, greq()))


@pytest.mark.parametrize(
    "junk",
    [
        "42",
        "[1, 2]",
        '{"choices": [{"delta": null, "text": 5, "finish_reason": "stop"}]}',
        '{"choices": ["x"]}',
    ],
)
def test_malformed_upstream_chunks_are_an_upstream_error(fakes: Any, junk: str) -> None:
    (u1, f1), _ = fakes
    f1.mode, f1.junk = "junk", junk
    cfg = UpstreamConfig(upstreams=(u1,), retries=0, breaker_failures=1, health_interval_s=0)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        with pytest.raises(ServeError) as e:
            await collect(b, greq())
        return e.value, b.breaker_states()[u1], b.in_flight

    err, state, in_flight = run_backend(cfg, go)
    assert (err.status, err.reason) == (502, "upstream_error")
    assert state is BreakerState.OPEN and in_flight == 0


@pytest.mark.parametrize("usage", ['{"completion_tokens": null, "prompt_tokens": "x"}', "[1]"])
def test_a_malformed_usage_is_ignored(fakes: Any, usage: str) -> None:
    (u1, f1), _ = fakes
    f1.mode = "junk"
    f1.junk = '{"choices": [{"text": "a", "finish_reason": "stop"}], "usage": ' + usage + "}"
    cfg = UpstreamConfig(upstreams=(u1,), retries=0, health_interval_s=0)
    chunks = run_backend(cfg, lambda b: collect(b, greq()))
    assert [(c.text, c.num_tokens, c.finish_reason) for c in chunks] == [
        ("a", 1, None),
        ("", 0, "stop"),
    ]
    assert chunks[-1].prompt_tokens is None


def test_client_disconnect_frees_the_slot_and_the_upstream_stream(fakes: Any) -> None:
    (u1, f1), _ = fakes
    f1.tokens, f1.delay = 50, 0.02
    cfg = UpstreamConfig(upstreams=(u1,), max_concurrency=1, health_interval_s=0)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        gen = b.generate(greq())
        first = await gen.__anext__()
        await gen.aclose()  # type: ignore[attr-defined]
        in_flight = b.in_flight
        # The only slot is free again: another request goes through.
        f1.tokens, f1.delay = 2, 0.0
        again = await collect(b, greq())
        await asyncio.sleep(0.2)
        return first, in_flight, again

    first, in_flight, again = run_backend(cfg, go)
    assert first.text == "t" and in_flight == 0
    assert sum(c.num_tokens for c in again) == 2
    assert f1.disconnected == 1
