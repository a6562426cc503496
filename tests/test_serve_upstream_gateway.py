"""The upstream backend as the gateway runs it: its config's validation, the real API
app in front of fake engines on 127.0.0.1 (429 with Retry-After, priority order,
upstream metrics, unknown params reaching the engine), and stopping (in-flight streams
drained, new ones refused, a retry cut short by the shutdown)."""

# ruff: noqa: F811 - the fixtures imported from serve_helpers are test parameters

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

import httpx

from serve_helpers import (  # noqa: F401  (engines, fakes: fixtures)
    _serve,
    collect,
    engines,
    fakes,
    greq,
)
from sloserve.core.errors import ConfigError
from sloserve.serve.backend import ServeError
from sloserve.serve.upstream import OpenAIUpstreamBackend
from sloserve.serve.upstream_config import UpstreamConfig


def test_config_validation() -> None:
    c = UpstreamConfig(upstreams=("http://a:1/", "http://b:2/v1"))
    assert c.upstreams == ("http://a:1", "http://b:2")
    for bad in (
        {"upstreams": ()},
        {"upstreams": ("ftp://a",)},
        {"upstreams": ("http://a:1", "http://a:1/")},
        {"upstreams": ("http://a:1",), "router": "nope"},
        {"upstreams": ("http://a:1",), "order": "lifo"},
        {"upstreams": ("http://a:1",), "max_concurrency": 0},
        {"upstreams": ("http://a:1",), "profile": "no-such-profile"},
        {"upstreams": ("http://a:1",), "typo": 1},
    ):
        with pytest.raises(ConfigError, match="upstream config"):
            UpstreamConfig.build(**bad)
    with pytest.raises(Exception, match="frozen"):
        c.router = "round-robin"  # type: ignore[misc]


@contextlib.contextmanager
def gateway(cfg: UpstreamConfig) -> Iterator[tuple[str, OpenAIUpstreamBackend]]:
    """The real gateway app (``serve/api.py``) over this backend, in a uvicorn thread."""
    from sloserve.serve.api import create_app

    backend = OpenAIUpstreamBackend(cfg)
    url, server, t = _serve(create_app(backend), lifespan="on")
    try:
        yield url, backend
    finally:
        server.should_exit = True
        t.join(10)


async def _post_all(url: str, bodies: list[dict[str, Any]], gap: float) -> list[Any]:
    async with httpx.AsyncClient(timeout=20) as c:

        async def one(k: int, body: dict[str, Any]) -> Any:
            await asyncio.sleep(k * gap)
            r = await c.post(url + "/v1/completions", json=body)
            return r.status_code, dict(r.headers), r.json()

        return await asyncio.gather(*(one(k, b) for k, b in enumerate(bodies)))


def test_gateway_answers_429_queue_full_with_retry_after(fakes: Any) -> None:
    (u1, f1), _ = fakes
    f1.tokens, f1.delay = 4, 0.1  # 0.4 s per request: the 1 slot and 1 queue place fill up
    cfg = UpstreamConfig(
        upstreams=(u1,), max_concurrency=1, max_queue=1, admission="queue", health_interval_s=0
    )
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 4}
    with gateway(cfg) as (url, _):
        out = asyncio.run(_post_all(url, [body] * 3, 0.05))
    assert [s for s, _, _ in out] == [200, 200, 429]
    _, headers, err = out[2]
    assert headers["x-sloserve-drop-reason"] == "queue_full"
    assert int(headers["retry-after"]) >= 1
    assert "queue full" in err["error"]["message"]
    assert out[0][2]["usage"]["completion_tokens"] == 4


def test_gateway_priority_order_reaches_the_engine(fakes: Any) -> None:
    (u1, f1), _ = fakes
    f1.tokens, f1.delay = 3, 0.1
    cfg = UpstreamConfig(
        upstreams=(u1,), max_concurrency=1, order="priority", admission="none", health_interval_s=0
    )
    bodies = [
        {"model": "fake-model", "prompt": name, "max_tokens": 3, "priority": prio}
        for name, prio in [("blocker", 0), ("late", 9), ("mid", 5), ("urgent", 0)]
    ]
    with gateway(cfg) as (url, _):
        out = asyncio.run(_post_all(url, bodies, 0.03))
    assert all(s == 200 for s, _, _ in out)
    assert [b["prompt"] for b in f1.bodies] == ["blocker", "urgent", "mid", "late"]
    assert all("priority" not in b for b in f1.bodies)  # forward_priority is off


def test_gateway_metrics_show_upstreams(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.metrics = "vllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n"
    f2.healthy = False
    cfg = UpstreamConfig(upstreams=(u1, u2), health_interval_s=0.1)
    with gateway(cfg) as (url, _):
        text = httpx.get(url + "/metrics", timeout=5).text
        health = httpx.get(url + "/health", timeout=5)
    assert f'sloserve_replica_running{{replica="{u1}"}} 2.0' in text
    assert f'sloserve_replica_kv_usage_ratio{{replica="{u1}"}} 0.5' in text
    assert f'sloserve_replica_healthy{{replica="{u2}"}} 0.0' in text
    assert health.status_code == 200


def test_unknown_params_reach_the_engine_in_lenient_mode(fakes: Any) -> None:
    (u1, f1), _ = fakes
    from sloserve.serve.api import create_app

    assert OpenAIUpstreamBackend.forwards_unknown_params  # a proxy: the engine decides
    backend = OpenAIUpstreamBackend(UpstreamConfig(upstreams=(u1,), health_interval_s=0))
    url, server, t = _serve(create_app(backend), lifespan="on")
    try:
        body = {"model": "fake-model", "prompt": "hi", "max_tokens": 4, "top_k": 5}
        r = httpx.post(url + "/v1/completions", json=body, timeout=10)
    finally:
        server.should_exit = True
        t.join(10)
    if r.status_code == 400:  # strict mode: refused, never silently dropped
        assert "top_k" in r.text
    else:
        assert r.status_code == 200 and f1.bodies[-1].get("top_k") == 5


def test_stop_drains_in_flight_streams_and_refuses_new_ones(fakes: Any) -> None:
    (u1, f1), _ = fakes
    f1.tokens, f1.delay = 6, 0.05

    async def scenario(drain_s: float) -> tuple[Any, Any]:
        b = OpenAIUpstreamBackend(UpstreamConfig(upstreams=(u1,), health_interval_s=0))
        await b.start()
        running = asyncio.create_task(collect(b, greq()))
        await asyncio.sleep(0.1)
        stopping = asyncio.create_task(b.stop(drain_s))
        await asyncio.sleep(0)
        with pytest.raises(ServeError) as e:
            await collect(b, greq())
        await stopping
        try:
            return await running, e.value
        except ServeError as err:
            return err, e.value

    done, refused = asyncio.run(scenario(5.0))
    assert (refused.status, refused.reason) == (503, "shutdown")
    assert sum(c.num_tokens for c in done) == 6  # drained: finished normally
    cut, _ = asyncio.run(scenario(0.05))
    assert isinstance(cut, ServeError) and cut.reason == "upstream_error"  # ended, not hung


def test_a_retry_after_shutdown_is_a_serve_error_not_a_crash(fakes: Any) -> None:
    (u1, f1), _ = fakes
    f1.mode, f1.drop_after = "stall", 0  # silent before its first token

    async def main() -> Any:
        b = OpenAIUpstreamBackend(UpstreamConfig(upstreams=(u1,), health_interval_s=0))
        await b.start()
        running = asyncio.create_task(collect(b, greq()))
        await asyncio.sleep(0.2)
        await b.stop(0.05)  # closes the client: the stream breaks before a token
        with pytest.raises(ServeError) as e:
            await asyncio.wait_for(running, 5)
        return e.value, b.in_flight

    err, in_flight = asyncio.run(main())
    assert err.status in (502, 503) and in_flight == 0
