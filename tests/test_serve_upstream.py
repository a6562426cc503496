"""The ``openai`` upstream backend: proxying, retries, breaker, health, queue, admission.

Proxy tests run a small fake OpenAI-compatible engine (FastAPI in a uvicorn thread on
127.0.0.1) whose behaviour each test sets; queue and admission tests need no HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from sloserve.core.errors import ConfigError
from sloserve.core.request import SLO, RequestClass
from sloserve.serve.backend import GenerationRequest, ServeError, TokenChunk
from sloserve.serve.breaker import BreakerState, CircuitBreaker
from sloserve.serve.scrape import parse_engine_load
from sloserve.serve.upstream import OpenAIUpstreamBackend
from sloserve.serve.upstream_config import UpstreamConfig

# ---------------------------------------------------------------------------- fake engine


class FakeEngine:
    """An OpenAI-compatible streaming server whose behaviour the test sets."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.mode = "ok"  # ok | status500 | status400 | drop | no_finish
        self.tokens = 4
        self.tokens_per_chunk = 1
        self.delay = 0.0
        self.drop_after = 1
        self.healthy = True
        self.metrics = ""
        self.disconnected = 0
        self.junk = "42"
        """What ``junk`` mode sends as its only SSE data (valid JSON, not a chunk object)."""
        app = FastAPI()

        @app.get("/health")
        async def health() -> Any:
            return PlainTextResponse("ok", status_code=200 if self.healthy else 503)

        @app.get("/metrics")
        async def metrics() -> Any:
            return PlainTextResponse(self.metrics)

        @app.get("/v1/models")
        async def models() -> Any:
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            return await self._answer(request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            return await self._answer(request, chat=True)

        self.app = app

    async def _answer(self, request: Request, chat: bool) -> Any:
        body = await request.json()
        self.bodies.append(body)
        if self.mode == "status500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if self.mode == "status400":
            return JSONResponse({"error": {"message": "bad max_tokens"}}, status_code=400)
        mode, n, per, delay, drop_after = (
            self.mode,
            self.tokens,
            self.tokens_per_chunk,
            self.delay,
            self.drop_after,
        )

        def chunk(text: str | None, finish: str | None) -> str:
            if chat:
                delta = {} if text is None else {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            return "data: " + json.dumps({"id": "x", "choices": [choice]}) + "\n\n"

        async def events() -> AsyncIterator[str]:
            try:
                if mode == "junk":
                    yield "data: " + self.junk + "\n\n"
                    return
                if chat:
                    yield (
                        "data: "
                        + json.dumps(
                            {
                                "choices": [
                                    {"index": 0, "delta": {"role": "assistant", "content": ""}}
                                ]
                            }
                        )
                        + "\n\n"
                    )
                for k in range(0, n, per):
                    if mode == "drop" and k >= drop_after:
                        raise RuntimeError("engine died")
                    if mode == "stall" and k >= drop_after:
                        await asyncio.sleep(30)  # alive but silent
                    await asyncio.sleep(delay)
                    yield chunk("t" * per, None)
                if mode == "no_finish":
                    return
                yield chunk(None, "length")
                usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": n + 7}
                yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"
            except asyncio.CancelledError:
                self.disconnected += 1
                raise

        return StreamingResponse(events(), media_type="text/event-stream")


def _serve(app: FastAPI, lifespan: str = "off") -> tuple[str, uvicorn.Server, threading.Thread]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan=lifespan))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "fake engine did not start"
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, t


@pytest.fixture(scope="module")
def engines() -> Iterator[list[tuple[str, FakeEngine]]]:
    out, servers = [], []
    for _ in range(2):
        fe = FakeEngine()
        url, server, t = _serve(fe.app)
        out.append((url, fe))
        servers.append((server, t))
    yield out
    for server, t in servers:
        server.should_exit = True
        t.join(5)


@pytest.fixture
def fakes(engines: list[tuple[str, FakeEngine]]) -> list[tuple[str, FakeEngine]]:
    for _, fe in engines:  # reset behaviour between tests (module-scoped servers)
        fe.bodies.clear()
        fe.mode, fe.tokens, fe.tokens_per_chunk, fe.delay = "ok", 4, 1, 0.0
        fe.healthy, fe.metrics, fe.disconnected, fe.drop_after = True, "", 0, 1
        fe.junk = "42"
    return engines


def greq(
    *,
    endpoint: str = "completions",
    prompt: int = 10,
    max_tokens: int = 4,
    priority: int = 0,
    slo: SLO | None = None,
    arrival: float | None = None,
    cls: RequestClass = RequestClass.RT,
    body: dict[str, Any] | None = None,
) -> GenerationRequest:
    return GenerationRequest(
        request_id="cmpl-t",
        endpoint=endpoint,  # type: ignore[arg-type]
        model="fake-model",
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        arrival=time.monotonic() if arrival is None else arrival,
        priority=priority,
        slo=slo or SLO(),
        request_class=cls,
        body=body if body is not None else {"model": "fake-model", "prompt": "hi"},
    )


async def collect(b: OpenAIUpstreamBackend, r: GenerationRequest) -> list[TokenChunk]:
    return [c async for c in b.generate(r)]


def run_backend(cfg: UpstreamConfig, fn: Any) -> Any:
    async def main() -> Any:
        b = OpenAIUpstreamBackend(cfg)
        await b.start()
        try:
            return await fn(b)
        finally:
            await b.stop(1.0)

    return asyncio.run(main())


# ---------------------------------------------------------------------------- proxying


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


def test_retry_before_first_byte_goes_to_the_other_upstream(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.mode = "status500"
    cfg = UpstreamConfig(upstreams=(u1, u2), router="round-robin", health_interval_s=0)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        out = [await collect(b, greq()) for _ in range(4)]
        return out, b.breakers()[u1]._failures, b.replicas()

    out, failures, reps = run_backend(cfg, go)
    assert all(sum(c.num_tokens for c in o) == 4 for o in out)
    assert len(f2.bodies) == 4 and failures >= 1
    assert all(r.in_flight == 0 for r in reps)


def test_all_upstreams_failing_is_an_explicit_error_and_opens_breakers(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.mode = f2.mode = "status500"
    cfg = UpstreamConfig(upstreams=(u1, u2), retries=1, breaker_failures=2, health_interval_s=0)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        errs = []
        for _ in range(2):
            with pytest.raises(ServeError) as e:
                await collect(b, greq())
            errs.append(e.value)
        # Both breakers are open now: the next request is refused at once with 503.
        with pytest.raises(ServeError) as e:
            await collect(b, greq())
        return errs, e.value, b.breaker_states()

    errs, last, states = run_backend(cfg, go)
    assert [(e.status, e.reason) for e in errs] == [(502, "upstream_error")] * 2
    assert (last.status, last.reason) == (503, "no_backend") and last.retry_after_s
    assert set(states.values()) == {BreakerState.OPEN}
    assert len(f1.bodies) + len(f2.bodies) == 4  # 2 requests x (1 try + 1 retry)


def test_mid_stream_failure_is_not_retried(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.mode, f1.drop_after = "drop", 2
    cfg = UpstreamConfig(upstreams=(u1, u2), router="round-robin", health_interval_s=0)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        got: list[TokenChunk] = []
        with pytest.raises(ServeError) as e:
            async for c in b.generate(greq()):
                got.append(c)
        return got, e.value

    got, err = run_backend(cfg, go)
    assert [c.text for c in got] == ["t", "t"]
    assert (err.status, err.reason) == (502, "upstream_error")
    assert len(f2.bodies) == 0


def test_stream_without_finish_reason_is_an_error(fakes: Any) -> None:
    (u1, f1), _ = fakes
    f1.mode = "no_finish"
    cfg = UpstreamConfig(upstreams=(u1,), retries=0, health_interval_s=0)
    with pytest.raises(ServeError, match="without a finish reason"):
        run_backend(cfg, lambda b: collect(b, greq()))


def test_client_4xx_passes_through_without_retry_or_breaker(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.mode = f2.mode = "status400"
    cfg = UpstreamConfig(upstreams=(u1, u2), breaker_failures=1, health_interval_s=0)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        with pytest.raises(ServeError) as e:
            await collect(b, greq())
        return e.value, b.breaker_states()

    err, states = run_backend(cfg, go)
    assert (err.status, err.reason) == (400, "upstream_rejected")
    assert "bad max_tokens" in str(err)
    assert len(f1.bodies) + len(f2.bodies) == 1
    assert set(states.values()) == {BreakerState.CLOSED}


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


def test_health_scrape_models_and_no_backend(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.metrics = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="m"} 3\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} 5\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="m"} 0.42\n'
    )
    f2.healthy = False
    cfg = UpstreamConfig(upstreams=(u1, u2), health_interval_s=0.05)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        reps = b.replicas()
        picks = [await collect(b, greq()) for _ in range(3)]
        f1.healthy = False
        await asyncio.sleep(0.3)
        with pytest.raises(ServeError) as e:
            await collect(b, greq())
        f2.healthy = True
        await asyncio.sleep(0.3)
        ok = await collect(b, greq())
        return reps, picks, e.value, ok, list(b.models())

    reps, picks, err, ok, models = run_backend(cfg, go)
    assert all(p[-1].finish_reason == "length" for p in picks)
    assert (reps[0].waiting, reps[0].running, reps[0].kv_usage) == (3, 5, 0.42)
    assert reps[0].healthy and not reps[1].healthy
    assert len(f2.bodies) == 1 and len(f1.bodies) == 3  # unhealthy one got nothing until back
    assert (err.status, err.reason) == (503, "no_backend")
    assert ok[-1].finish_reason == "length"
    assert models == ["fake-model"]


# ---------------------------------------------------------------------------- queue (no HTTP)


def offline_backend(**kw: Any) -> OpenAIUpstreamBackend:
    kw.setdefault("upstreams", ("http://127.0.0.1:9",))
    kw.setdefault("max_concurrency", 1)
    kw.setdefault("health_interval_s", 0)
    return OpenAIUpstreamBackend(UpstreamConfig(**kw))


def grant_order(b: OpenAIUpstreamBackend, reqs: list[GenerationRequest]) -> list[int]:
    """Fill the only slot, queue ``reqs`` in list order, free slots one by one."""

    async def main() -> list[int]:
        blocker = greq()
        b._take(0, blocker)
        order: list[int] = []

        async def one(k: int, r: GenerationRequest) -> None:
            i = await b._acquire(r, frozenset())
            order.append(k)
            await asyncio.sleep(0.01)
            b._release(i, r, True)

        tasks = []
        for k, r in enumerate(reqs):
            tasks.append(asyncio.create_task(one(k, r)))
            await asyncio.sleep(0)
        assert b.queue_size == len(reqs)
        b._release(0, blocker, True)
        await asyncio.gather(*tasks)
        return order

    return asyncio.run(main())


def test_queue_orders_fcfs_priority_edf() -> None:
    now = time.monotonic()
    reqs = [
        greq(arrival=now + 0.001, priority=5, slo=SLO(ttft_s=9.0)),
        greq(arrival=now + 0.002, priority=1),
        greq(arrival=now + 0.003, priority=3, slo=SLO(ttft_s=0.5)),
        greq(arrival=now + 0.004, priority=1, slo=SLO(deadline_s=2.0)),
    ]
    assert grant_order(offline_backend(order="fcfs"), reqs) == [0, 1, 2, 3]
    assert grant_order(offline_backend(order="priority"), reqs) == [1, 3, 2, 0]
    # EDF: 0.5 s TTFT target, 2 s deadline, 9 s target, then no deadline.
    assert grant_order(offline_backend(order="edf"), reqs) == [2, 3, 0, 1]


def test_edf_slack_uses_the_cost_model() -> None:
    # Same absolute deadline; the long prompt and long output need more time: less slack.
    now = time.monotonic()
    reqs = [
        greq(arrival=now, prompt=10, max_tokens=4, slo=SLO(deadline_s=30.0)),
        greq(arrival=now, prompt=4000, max_tokens=1000, slo=SLO(deadline_s=30.0)),
    ]
    assert grant_order(offline_backend(order="edf"), reqs) == [0, 1]
    assert grant_order(offline_backend(order="edf", profile="llama-2-7b-a100"), reqs) == [1, 0]


def test_admission_queue_full_no_backend_and_slo() -> None:
    async def main() -> None:
        b = offline_backend(max_queue=1, admission="queue")
        b._take(0, greq())
        waiting = asyncio.create_task(b._acquire(greq(), frozenset()))
        await asyncio.sleep(0)
        with pytest.raises(ServeError) as e:
            b._admit(greq())
        assert (e.value.status, e.value.reason) == (429, "queue_full")
        assert e.value.retry_after_s is not None and e.value.retry_after_s >= 1
        # admission none: never refused for load.
        b2 = offline_backend(max_queue=0, admission="none")
        b2._take(0, greq())
        b2._admit(greq())
        # No healthy upstream: 503.
        b._ups[0].health_ok = False
        with pytest.raises(ServeError) as e:
            b._admit(greq())
        assert (e.value.status, e.value.reason) == (503, "no_backend")
        # The queued request notices too: nothing hangs.
        with pytest.raises(ServeError) as e:
            await asyncio.wait_for(waiting, 2)
        assert e.value.reason == "no_backend"
        assert b.rejected == {"queue_full": 1, "no_backend": 2}

    asyncio.run(main())


def test_slo_admission_rejects_rt_that_cannot_make_it() -> None:
    b = offline_backend(admission="slo", profile="llama-2-7b-a100", max_concurrency=4)
    # Prefill of 4000 tokens on a 7B/A100 takes ~0.3 s: a 50 ms TTFT target cannot be met.
    with pytest.raises(ServeError) as e:
        b._admit(greq(prompt=4000, slo=SLO(ttft_s=0.05)))
    assert (e.value.status, e.value.reason) == (429, "deadline")
    b._admit(greq(prompt=4000, slo=SLO(ttft_s=5.0)))
    b._admit(greq(prompt=4000, slo=SLO(ttft_s=0.05), cls=RequestClass.BE))
    b._admit(greq(prompt=4000))  # no SLO, nothing to miss
    # Without a profile and before any observation there is no estimate: admitted.
    offline_backend(admission="slo")._admit(greq(prompt=4000, slo=SLO(ttft_s=0.05)))


def test_slo_admission_drops_queued_request_once_hopeless() -> None:
    async def main() -> None:
        b = offline_backend(admission="slo")
        b._take(0, greq())
        t0 = time.monotonic()
        with pytest.raises(ServeError) as e:
            await b._acquire(greq(slo=SLO(ttft_s=0.3)), frozenset())
        assert e.value.reason == "deadline" and e.value.status == 429
        assert 0.25 < time.monotonic() - t0 < 1.5
        assert b.queue_size == 0

    asyncio.run(main())


def test_cancelled_while_queued_leaves_no_trace() -> None:
    async def main() -> None:
        b = offline_backend()
        first = greq()
        b._take(0, first)
        t = asyncio.create_task(b._acquire(greq(), frozenset()))
        await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        b._release(0, first, True)
        assert b.in_flight == 0 and b.queue_size == 0

    asyncio.run(main())


# ---------------------------------------------------------------------------- breaker, scrape, config


def test_breaker_opens_half_opens_and_recovers() -> None:
    now = [0.0]
    br = CircuitBreaker(failure_threshold=2, open_s=5.0, clock=lambda: now[0])
    br.record_failure()
    assert br.state is BreakerState.CLOSED
    br.record_success()  # resets the consecutive count
    br.record_failure()
    br.record_failure()
    assert br.state is BreakerState.OPEN and not br.allow()
    assert br.retry_after_s() == 5.0
    now[0] = 5.0
    assert br.state is BreakerState.HALF_OPEN
    assert br.allow() and not br.allow()  # one probe at a time
    br.record_failure()  # probe failed: open again, for another 5 s
    assert br.state is BreakerState.OPEN and br.times_opened == 2
    now[0] = 10.0
    permit = br.acquire()
    assert permit is not None
    br.release(permit)  # probe ended without a verdict: slot back
    assert br.allow()
    br.record_success()
    assert br.state is BreakerState.CLOSED and br.allow() and br.allow()
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0)


def test_scrape_vllm_sglang_sloserve_and_missing() -> None:
    old_vllm = (
        'vllm:num_requests_waiting{model_name="a"} 1\nvllm:num_requests_waiting{model_name="b"} 2\n'
        'vllm:num_requests_running{model_name="a"} 4\nvllm:gpu_cache_usage_perc{model_name="a"} 0.5\n'
    )
    assert parse_engine_load(old_vllm) == parse_engine_load(old_vllm)  # deterministic
    load = parse_engine_load(old_vllm)
    assert (load.waiting, load.running, load.kv_usage) == (3, 4, 0.5)
    sglang = "sglang:num_queue_reqs 7\nsglang:num_running_reqs 2\nsglang:token_usage 0.25\n"
    load = parse_engine_load(sglang)
    assert (load.waiting, load.running, load.kv_usage) == (7, 2, 0.25)
    ours = (
        'sloserve_replica_waiting{replica="replica-0"} 1\nsloserve_replica_waiting{replica="replica-1"} 2\n'
        'sloserve_replica_kv_usage{replica="replica-0"} 0.2\nsloserve_replica_kv_usage{replica="replica-1"} 0.4\n'
    )
    load = parse_engine_load(ours)
    assert load.waiting == 3 and load.running is None and load.kv_usage == pytest.approx(0.3)
    assert parse_engine_load("process_cpu_seconds_total 3\n").waiting is None
    with pytest.raises(ValueError):
        parse_engine_load("this is { not prometheus")


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


# ---------------------------------------------------------------------------- through the API


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


def test_slo_aware_routing_uses_the_cost_model_per_request() -> None:
    b = offline_backend(
        upstreams=("http://127.0.0.1:9", "http://127.0.0.1:10"),
        router="slo-aware",
        profile="llama-2-7b-a100",
        max_concurrency=8,
    )
    b._ups[0].queued_prompt_tokens = 8000  # a long prefill queued there
    b._ups[1].in_flight = 6  # busy decoding, but no prefill ahead
    assert b._pick(greq(prompt=500)) == 1
    states = b.replicas()
    assert states[0].predicted_ttft_s is not None and states[1].predicted_ttft_s is not None
    assert states[0].predicted_ttft_s > states[1].predicted_ttft_s
    b._ups[1].in_flight = 8  # full: the only one with a slot wins whatever its TTFT
    assert b._pick(greq(prompt=500)) == 0


def test_slo_admission_without_profile_recovers_after_a_burst() -> None:
    b = offline_backend(admission="slo", max_concurrency=4)
    u = b._ups[0]
    u.ttft_min, u.ttft_ewma = 0.02, 2.0  # slow answers under a burst
    u.in_flight = 3
    with pytest.raises(ServeError):
        b._admit(greq(slo=SLO(ttft_s=0.5)))
    # The burst is over: nothing in flight, the idle TTFT applies again.
    u.in_flight = 0
    b._admit(greq(slo=SLO(ttft_s=0.5)))


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 3),
    order=st.sampled_from(["fcfs", "priority", "edf"]),
    reqs=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.booleans(), st.integers(0, 2)),
        min_size=1,
        max_size=14,
    ),
)
def test_queue_invariants(k: int, order: str, reqs: list[tuple[int, int, bool, int]]) -> None:
    """Slots never oversubscribed; each grant goes to the best-ranked waiting request; every
    request is granted once or cancelled; nothing is left behind."""
    b = offline_backend(max_concurrency=k, order=order)
    grants: list[str] = []
    take = b._take

    def checked_take(i: int, r: GenerationRequest) -> None:
        assert b._ups[i].in_flight < k
        waiting = [w.key for w in b._queue if not w.fut.done() and w.req is not r]
        mine = b._queue_key(r)
        assert all(mine <= key for key in waiting), (mine, waiting)
        grants.append(r.request_id)
        take(i, r)

    b._take = checked_take  # type: ignore[method-assign]

    async def main() -> None:
        t0 = time.monotonic()

        async def one(n: int, prio: int, hold: int, cancel: bool, gap: int) -> None:
            for _ in range(gap):
                await asyncio.sleep(0)
            slo = SLO(ttft_s=1.0 + prio) if prio else SLO()
            r = greq(arrival=t0 + n * 1e-3, priority=prio, slo=slo)
            r.request_id = f"r{n}"
            task = asyncio.ensure_future(b._acquire(r, frozenset()))
            if cancel:
                await asyncio.sleep(0)
                task.cancel()
            try:
                i = await task
            except asyncio.CancelledError:
                return
            for _ in range(hold):
                await asyncio.sleep(0)
            b._release(i, r, True)

        await asyncio.gather(*(one(n, *spec) for n, spec in enumerate(reqs)))

    asyncio.run(main())
    assert len(grants) == len(set(grants))
    assert len(grants) >= sum(1 for *_, cancel, _ in reqs if not cancel)
    assert b.in_flight == 0 and b.queue_size == 0


def test_requests_go_to_upstreams_serving_their_model() -> None:
    b = offline_backend(upstreams=("http://127.0.0.1:9", "http://127.0.0.1:10"), max_concurrency=4)
    b._ups[0].models, b._ups[1].models = ("llama",), ("mistral",)
    r = greq()
    r.model = "mistral"
    assert {b._pick(r) for _ in range(4)} == {1}
    r.model = "llama"
    assert {b._pick(r) for _ in range(4)} == {0}
    b._ups[1].models = ()  # has not said: may serve anything
    assert {b._pick(r) for _ in range(6)} == {0, 1}
    assert sorted(b.models()) == ["llama"]
    b._ups[1].models = ("mistral",)
    r.model = "gpt-4"
    with pytest.raises(ServeError) as e:
        b._admit(r)
    assert (e.value.status, e.value.reason) == (404, "model")
    r.model = "llama"
    b._ups[0].health_ok = False  # the one serving llama is down: 503, though 1 is healthy
    with pytest.raises(ServeError) as e:
        b._admit(r)
    assert (e.value.status, e.value.reason) == (503, "no_backend")


def test_a_waiter_for_a_busy_model_does_not_block_others() -> None:
    async def main() -> list[str]:
        b = offline_backend(upstreams=("http://127.0.0.1:9", "http://127.0.0.1:10"))
        b._ups[0].models, b._ups[1].models = ("llama",), ("mistral",)
        blockers = []
        for i, model in enumerate(("llama", "mistral")):
            r = greq()
            r.model = model
            b._take(i, r)
            blockers.append(r)
        order: list[str] = []

        async def one(model: str) -> None:
            r = greq()
            r.model = model
            await b._acquire(r, frozenset())
            order.append(model)

        tasks = [asyncio.create_task(one(m)) for m in ("llama", "mistral")]
        await asyncio.sleep(0.01)
        b._release(1, blockers[1], True)  # only the mistral upstream frees a slot
        await asyncio.sleep(0.01)
        first = list(order)
        b._release(0, blockers[0], True)
        await asyncio.gather(*tasks)
        return first

    assert asyncio.run(main()) == ["mistral"]


def test_stream_cut_before_its_first_token_is_retried(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.mode, f1.drop_after = "drop", 0  # 200 and headers, then dies before any token
    cfg = UpstreamConfig(upstreams=(u1, u2), router="round-robin", health_interval_s=0)
    chunks = run_backend(cfg, lambda b: collect(b, greq()))
    assert sum(c.num_tokens for c in chunks) == 4 and chunks[-1].finish_reason == "length"
    assert len(f1.bodies) == 1 and len(f2.bodies) == 1


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


def test_a_silent_upstream_times_out_instead_of_hanging(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.mode, f1.drop_after = "stall", 0  # silent before the first token: retried on u2
    cfg = UpstreamConfig(
        upstreams=(u1, u2), router="round-robin", read_timeout_s=0.3, health_interval_s=0
    )
    t0 = time.monotonic()
    chunks = run_backend(cfg, lambda b: collect(b, greq()))
    assert sum(c.num_tokens for c in chunks) == 4 and time.monotonic() - t0 < 3
    assert len(f2.bodies) == 1
    f1.drop_after = 2  # silent after 2 tokens: an explicit error, not a hang
    cfg = UpstreamConfig(upstreams=(u1,), read_timeout_s=0.3, health_interval_s=0)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        got: list[TokenChunk] = []
        with pytest.raises(ServeError) as e:
            async for c in b.generate(greq()):
                got.append(c)
        return got, e.value

    got, err = run_backend(cfg, go)
    assert len(got) == 2 and err.reason == "upstream_error" and "ReadTimeout" in str(err)


# ---------------------------------------------------------------------------- review fixes


def test_cancelled_after_its_slot_was_granted_returns_its_queued_prompt_tokens() -> None:
    async def main() -> None:
        b = offline_backend()
        first = greq()
        b._take(0, first)
        t = asyncio.create_task(b._acquire(greq(prompt=500), frozenset()))
        await asyncio.sleep(0.01)
        b._release(0, first, True)  # grants the waiter's future before its task resumes
        b._ups[0].queued_prompt_tokens -= first.prompt_tokens  # (generate() does this)
        t.cancel()  # the client goes away in that instant
        with pytest.raises(asyncio.CancelledError):
            await t
        assert b.in_flight == 0 and b.queue_size == 0
        assert b._ups[0].queued_prompt_tokens == 0

    asyncio.run(main())


def test_half_open_admits_one_probe_even_when_other_requests_end_without_verdict() -> None:
    now = [0.0]
    br = CircuitBreaker(failure_threshold=1, open_s=1.0, clock=lambda: now[0])
    old = br.acquire()  # sent while closed, still streaming
    assert old is not None
    br.record_failure()  # another request failed: open
    now[0] = 1.0
    probe = br.acquire()
    assert probe is not None and br.acquire() is None
    br.release(old)  # the old request's client went away: not a probe, frees nothing
    assert br.acquire() is None and not br.available()
    br.release(probe)
    assert br.available()
    # Through the backend: a request taken while closed ends without verdict in half-open.
    b = offline_backend(breaker_failures=1, breaker_open_s=0.0, max_concurrency=4)
    early, fail, probe_req = greq(), greq(), greq()
    b._take(0, early)
    b._take(0, fail)
    b._ups[0].breaker.open_s = 60.0
    b._release(0, fail, False)  # opens
    b._ups[0].breaker.open_s = 0.0  # cool-down over: half-open
    b._take(0, probe_req)
    assert not b._available(0)
    b._release(0, early, None)
    assert not b._available(0)  # still one probe in flight: no second one


def test_scrape_survives_infinite_and_negative_values() -> None:
    load = parse_engine_load(
        "vllm:num_requests_waiting +Inf\nvllm:num_requests_running -3\n"
        "vllm:kv_cache_usage_perc +Inf\n"
    )
    assert load.waiting is None and load.running == 0 and load.kv_usage is None


def test_odd_metrics_do_not_kill_health_checks(fakes: Any) -> None:
    (u1, f1), _ = fakes
    f1.metrics = "vllm:num_requests_waiting 1e400\n"
    cfg = UpstreamConfig(upstreams=(u1,), health_interval_s=0.05)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        f1.healthy = False
        await asyncio.sleep(0.3)
        assert b._health_task is not None and not b._health_task.done()
        return b.replicas()[0].healthy

    assert run_backend(cfg, go) is False


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


def test_slo_admission_counts_only_the_requests_served_before_it() -> None:
    b = offline_backend(order="priority", admission="slo", max_concurrency=1)
    u = b._ups[0]
    u.ttft_ewma, u.ttft_min, u.duration_ewma = 0.01, 0.01, 1.0

    async def main() -> None:
        b._take(0, greq())
        now = time.monotonic()
        low = [
            asyncio.create_task(b._acquire(greq(priority=10, arrival=now), frozenset()))
            for _ in range(5)
        ]
        await asyncio.sleep(0)
        assert b.queue_size == 5
        # Served first (priority 0 < 10): one request's time until the slot frees, ~1 s.
        b._admit(greq(priority=0, slo=SLO(ttft_s=1.5)))
        with pytest.raises(ServeError):  # behind the five: ~6 s
            b._admit(greq(priority=20, slo=SLO(ttft_s=1.5)))
        for t in low:
            t.cancel()
        await asyncio.gather(*low, return_exceptions=True)

    asyncio.run(main())


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
