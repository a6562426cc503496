"""When an upstream fails, against fake engines on 127.0.0.1 and on the breaker alone: a
failure before the first token is retried on another upstream, one after it never is,
a client error (4xx) passes through, a silent upstream times out, and the circuit
breaker opens, half-opens (one probe at a time) and recovers."""

# ruff: noqa: F811 - the fixtures imported from serve_helpers are test parameters

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from serve_helpers import (  # noqa: F401  (engines, fakes: fixtures)
    collect,
    engines,
    fakes,
    greq,
    offline_backend,
    run_backend,
)
from sloserve.serve.backend import ServeError, TokenChunk
from sloserve.serve.breaker import BreakerState, CircuitBreaker
from sloserve.serve.upstream import OpenAIUpstreamBackend
from sloserve.serve.upstream_config import UpstreamConfig


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


def test_stream_cut_before_its_first_token_is_retried(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.mode, f1.drop_after = "drop", 0  # 200 and headers, then dies before any token
    cfg = UpstreamConfig(upstreams=(u1, u2), router="round-robin", health_interval_s=0)
    chunks = run_backend(cfg, lambda b: collect(b, greq()))
    assert sum(c.num_tokens for c in chunks) == 4 and chunks[-1].finish_reason == "length"
    assert len(f1.bodies) == 1 and len(f2.bodies) == 1


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
