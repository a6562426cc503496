"""The upstream backend's own request queue, without HTTP: FCFS, priority and EDF order
(EDF's slack from the cost model), cancellation while queued or in the instant a slot
is granted, a waiter for a busy model not blocking others, and the queue's invariants
under hypothesis."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from serve_helpers import grant_order, greq, offline_backend
from sloserve.core.request import SLO
from sloserve.serve.backend import GenerationRequest


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
