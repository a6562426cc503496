"""Admission at the upstream backend, without HTTP: queue full (429) and no healthy
upstream (503), and SLO admission, which refuses or drops an RT request that cannot
meet its TTFT target, estimated from the cost model or from the TTFTs observed."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from serve_helpers import greq, offline_backend
from sloserve.core.request import SLO, RequestClass
from sloserve.serve.backend import ServeError


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


def test_health_checks_tell_a_busy_engine_from_a_dead_one() -> None:
    """A timed-out check is what a live engine on a loaded host gives: only
    ``health_timeouts`` in a row mark it down, and a served stream brings it back. A refused
    connection or an error status marks it down at once. (Found as 503s for queued
    requests while the surviving upstream was merely slow to answer /health in CI.)"""
    import httpx

    answers: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        what = answers.pop(0)
        if what == "timeout":
            raise httpx.ReadTimeout("slow", request=request)
        if what == "refused":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(int(what), text="")

    async def main() -> None:
        b = offline_backend(health_timeouts=2)
        b._health_client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        u = b._ups[0]
        answers.extend(["timeout"])
        await b.check_health()
        assert u.health_ok and u.health_timeouts == 1
        b._admit(greq())  # still admitted: one slow answer is no death
        answers.extend(["timeout"])
        await b.check_health()
        assert not u.health_ok
        with pytest.raises(ServeError) as e:
            b._admit(greq())
        assert (e.value.status, e.value.reason) == (503, "no_backend")
        # A stream served there since proves it alive again.
        b._take(0, greq())
        b._release(0, greq(), True)
        assert u.health_ok and u.health_timeouts == 0
        # A refused connection, or an explicit error status, is believed at once.
        answers.extend(["refused"])
        await b.check_health()
        assert not u.health_ok
        answers.extend(["200", "200", "200", "503"])  # /health, /metrics, /v1/models; /health
        await b.check_health()
        assert u.health_ok
        await b.check_health()
        assert not u.health_ok
        b._take(0, greq())
        b._release(0, greq(), True)  # a served stream does not overrule an explicit 503
        assert not u.health_ok
        await b._health_client.aclose()

    asyncio.run(main())


def test_a_queued_request_is_refused_only_on_a_fresh_health_view() -> None:
    """An upstream marked down by the last round (checked before it listened) is checked
    again before a queued request would get 503 ``no_backend``; up, it serves it."""
    import httpx

    checks: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        checks.append(request.url.path)
        return httpx.Response(404 if request.url.path == "/v1/models" else 200, text="")

    async def main() -> None:
        b = offline_backend(health_interval_s=60.0)
        b._health_client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        u = b._ups[0]
        blocker = greq()
        b._take(0, blocker)
        waiting = asyncio.create_task(b._acquire(greq(), frozenset()))
        await asyncio.sleep(0)
        u.health_ok = False  # the stale verdict of the last round
        await asyncio.sleep(0.4)  # the waiter wakes, sees none healthy, re-checks
        assert "/health" in checks and u.health_ok and not waiting.done()
        b._release(0, blocker, True)
        assert await asyncio.wait_for(waiting, 2) == 0
        # Down for real: the fresh round confirms it and the refusal comes.
        b._health_client = httpx.AsyncClient(
            transport=httpx.MockTransport(lambda r: httpx.Response(503))
        )
        b._refreshed_at = 0.0
        u.health_ok = False
        with pytest.raises(ServeError) as e:
            async for _ in b.generate(greq()):
                pass
        assert (e.value.status, e.value.reason) == (503, "no_backend")

    asyncio.run(main())
