"""The emulated backend: engine replicas stepped in wall-clock time, and agreement with the
simulator on the same workload and policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any, cast

import numpy as np
import pytest

from serve_helpers import emulated, live_server, replay_over_http
from sloserve.core.request import SLO, QoESpec, Request, RequestClass, RequestStatus
from sloserve.engine.interface import InstanceView, Scheduler, SchedulerOutput
from sloserve.experiments.runner import InstanceConfig, SimConfig, simulate
from sloserve.policies.registry import policy_names
from sloserve.serve.backend import GenerationRequest, ServeError, TokenChunk
from sloserve.serve.emulated import EmulatedBackend
from sloserve.serve.schemas import filler_text
from sloserve.workloads.lengths import FixedLength

CONST = InstanceConfig(profile="llama-2-7b@a100-80gb", cost_model="constant:0.01")


def greq(prompt: int = 10, max_tokens: int = 5, **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id="cmpl-t", endpoint="completions", model="llama-2-7b",
        prompt_tokens=prompt, max_tokens=max_tokens, arrival=time.monotonic(), **kw,
    )  # fmt: skip


async def collect(be: EmulatedBackend, req: GenerationRequest) -> list[tuple[float, TokenChunk]]:
    return [(time.monotonic(), c) async for c in be.generate(req)]


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_tokens_follow_the_engine_timeline() -> None:
    """One chunk per token, each delivered at (never before) its iteration's end."""

    async def main() -> None:
        be = emulated(instance=CONST, time_scale=2.0)  # an iteration: 10 ms sim, 5 ms wall
        await be.start()
        got = await collect(be, greq(max_tokens=12))
        (inst,) = be.instances()
        (r,) = inst.done
        ends = be.t0 + np.asarray(inst.iter_end) / be.scale
        token_iters = r.token_iterations()
        assert [c.text for _t, c in got] == [filler_text(i) for i in range(12)]
        assert [c.num_tokens for _t, c in got] == [1] * 12
        assert [c.finish_reason for _t, c in got] == [None] * 11 + ["length"]
        assert got[-1][1].prompt_tokens == 10
        late = np.array([t for t, _c in got]) - ends[token_iters]
        assert (late >= 0).all()  # never early
        assert np.median(late) < 0.05  # and on time, give or take a busy machine
        # the emulated timeline itself is the simulator's: 10 ms per iteration
        assert np.diff(inst.iter_end) == pytest.approx(0.01)
        await be.stop(0)

    run(main())


def test_output_length_distribution_and_finish_reasons() -> None:
    async def main() -> None:
        be = emulated(instance=CONST, time_scale=20.0, output_length=FixedLength(value=4))
        await be.start()
        stop = await collect(be, greq(max_tokens=10))
        assert len(stop) == 4 and stop[-1][1].finish_reason == "stop"
        capped = await collect(be, greq(max_tokens=3))
        assert len(capped) == 3 and capped[-1][1].finish_reason == "length"
        floor = await collect(be, greq(max_tokens=10, body={"min_tokens": 6}))
        assert len(floor) == 6 and floor[-1][1].finish_reason == "stop"
        chosen = await collect(be, greq(max_tokens=10, output_tokens=2))
        assert len(chosen) == 2
        await be.stop(0)

    run(main())


def test_disconnect_aborts_and_frees_kv() -> None:
    async def main() -> None:
        be = emulated(instance=CONST, time_scale=20.0)
        await be.start()
        (inst,) = be.instances()
        gen = cast(AsyncGenerator[TokenChunk, None], be.generate(greq(prompt=300, max_tokens=1000)))
        for _ in range(3):
            await gen.__anext__()
        assert inst.kv.num_used_blocks > 0
        await gen.aclose()  # the client went away
        deadline = time.monotonic() + 5
        while inst.kv.num_used_blocks and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        (r,) = inst.done
        assert r.status is RequestStatus.ABORTED and r.num_output_tokens < 1000
        assert inst.kv.num_used_blocks == 0 and not inst.running
        inst.kv.check_invariants()
        assert be.replicas()[0].in_flight == 0
        await be.stop(0)

    run(main())


def test_engine_rejection_is_an_explicit_error() -> None:
    async def main() -> None:
        small = CONST.model_copy(update={"kv_capacity_tokens": 256})
        be = emulated(instance=small)
        await be.start()
        with pytest.raises(ServeError) as e:
            await collect(be, greq(prompt=300, max_tokens=10))
        assert e.value.status == 400 and e.value.reason == "exceeds_kv_capacity"
        assert "256" in str(e.value)
        assert len(await collect(be, greq(prompt=100, max_tokens=10))) == 10  # still serves
        await be.stop(0)

    run(main())


def test_replicas_share_the_load() -> None:
    async def main() -> None:
        be = emulated(instance=CONST, time_scale=20.0, replicas=2, router="least-loaded")
        await be.start()
        outs = await asyncio.gather(*(collect(be, greq(max_tokens=20)) for _ in range(6)))
        assert all(len(o) == 20 for o in outs)
        served = [len(inst.done) for inst in be.instances()]
        assert served == [3, 3]
        names = [s.name for s in be.replicas()]
        assert names == ["replica-0", "replica-1"]
        await be.stop(0)

    run(main())


def test_stop_ends_open_streams_and_refuses_new_ones() -> None:
    async def main() -> None:
        be = emulated(instance=CONST, time_scale=1.0)
        await be.start()
        gen = be.generate(greq(max_tokens=1000))
        await gen.__anext__()
        await be.stop(drain_timeout_s=0.05)
        with pytest.raises(ServeError) as e:
            async for _c in gen:
                pass
        assert e.value.reason == "shutdown" and e.value.status == 503
        with pytest.raises(ServeError):
            await collect(be, greq())
        assert not be.healthy
        (inst,) = be.instances()
        assert inst.kv.num_used_blocks == 0 and not inst.busy and inst.num_live == 0
        assert [r.status for r in inst.done] == [RequestStatus.ABORTED]

    run(main())


def test_queue_full_before_any_token() -> None:
    async def main() -> None:
        icfg = CONST.model_copy(update={"max_running": 1})
        be = emulated(instance=icfg, time_scale=1.0, max_queue=1, retry_after_s=2.5)
        await be.start()
        first = cast(AsyncGenerator[TokenChunk, None], be.generate(greq(max_tokens=100)))
        await first.__anext__()  # running
        second = asyncio.ensure_future(collect(be, greq(max_tokens=3)))
        await asyncio.sleep(0.005)
        assert be.replicas()[0].waiting == 1  # R_max = 1: it waits
        with pytest.raises(ServeError) as e:
            await collect(be, greq())
        assert (e.value.status, e.value.reason, e.value.retry_after_s) == (429, "queue_full", 2.5)
        await first.aclose()  # the running one goes away: the waiting one is served
        assert len(await second) == 3
        await be.stop(0)

    run(main())


def test_sheddable_requests_make_room_when_the_queue_is_full() -> None:
    """Issue 20, item 4, on the emulated backend: with the queue full a sheddable arrival
    is refused (429 ``shed``); a non-sheddable one takes the place of the least important
    sheddable request that has not started, which ends with 429 ``shed`` and leaves the
    cluster (no KV, never served); with no sheddable waiter it is ``queue_full``."""

    async def main() -> None:
        icfg = CONST.model_copy(update={"max_running": 1})
        be = emulated(instance=icfg, time_scale=1.0, max_queue=2, retry_after_s=1.0)
        await be.start()
        first = cast(AsyncGenerator[TokenChunk, None], be.generate(greq(max_tokens=200)))
        await first.__anext__()  # running: R_max = 1, the rest waits
        shed_a = asyncio.ensure_future(collect(be, greq(max_tokens=3, sheddable=True)))
        await asyncio.sleep(0.005)
        shed_b = asyncio.ensure_future(
            collect(be, greq(max_tokens=3, sheddable=True, priority=1))  # less important
        )
        await asyncio.sleep(0.005)
        assert be.replicas()[0].waiting == 2  # the queue is full
        with pytest.raises(ServeError) as e:  # a sheddable arrival: refused
            await collect(be, greq(sheddable=True))
        assert (e.value.status, e.value.reason) == (429, "shed")
        vip = asyncio.ensure_future(collect(be, greq(max_tokens=3)))
        await asyncio.sleep(0.005)
        with pytest.raises(ServeError) as e:  # the least important waiter made room
            await shed_b
        assert (e.value.status, e.value.reason, e.value.retry_after_s) == (429, "shed", 1.0)
        assert not shed_a.done() and be.replicas()[0].waiting == 2
        gone = [r for r in be.instances()[0].done if r.status is RequestStatus.ABORTED]
        assert len(gone) == 1 and gone[0].num_computed_tokens == 0
        assert be.cluster.abort_reasons[gone[0].req_id] == "shed"
        # The next important arrival displaces the other sheddable waiter...
        vip2 = asyncio.ensure_future(collect(be, greq(max_tokens=3)))
        await asyncio.sleep(0.005)
        with pytest.raises(ServeError) as e:
            await shed_a
        assert e.value.reason == "shed"
        # ...and with only important work waiting, nothing is displaced: queue_full.
        with pytest.raises(ServeError) as e:
            await collect(be, greq())
        assert (e.value.status, e.value.reason) == (429, "queue_full")
        await first.aclose()
        assert len(await vip) == 3 and len(await vip2) == 3
        await be.stop(0)

    run(main())


def test_sim_and_live_agree() -> None:
    """The same requests and policy through ``simulate`` and through the live gateway
    (sent at their arrival times): mean TTFT and TPOT within 10%."""
    rng = np.random.default_rng(3)
    n = 14
    arrivals = np.cumsum(rng.exponential(0.05, n))
    reqs = [
        Request(
            req_id=i,
            arrival=float(arrivals[i]),
            num_prompt_tokens=int(rng.integers(800, 2000)),
            true_output_len=int(rng.integers(30, 80)),
        )
        for i in range(n)
    ]
    icfg = InstanceConfig(profile="llama-2-7b@a100-80gb", max_running=4)
    sim = simulate(SimConfig(instance=icfg, policy="vllm"), reqs).table
    assert sim["ttft_s"].mean() > 1.0  # queueing: 14 requests, 4 at a time
    # Real time, and a TTFT that is mostly prefill and queueing: what the comparison
    # measures is the engine, not the loopback HTTP round trip (a few ms, more when the
    # machine is busy).
    scale = 1.0
    with live_server(instance=icfg, policy="vllm", time_scale=scale) as srv:
        live = asyncio.run(replay_over_http(srv.base_url, reqs, scale))
    assert (live["tokens"].to_numpy() == sim["generated_tokens"].to_numpy()).all()
    assert live["late_s"].max() < 0.05  # requests left on time
    for col in ("ttft_s", "tpot_s"):
        s, v = float(sim[col].mean()), float(live[col].mean())
        assert v == pytest.approx(s, rel=0.10), (col, s, v)


class _Stuck(Scheduler):
    """Schedules nothing, ever: the engine raises StallError with work waiting."""

    name = "stuck"

    def schedule(self, view: InstanceView) -> SchedulerOutput:
        return SchedulerOutput()


def test_engine_error_ends_streams_explicitly() -> None:
    async def main() -> None:
        be = emulated(instance=CONST, time_scale=20.0)
        await be.start()
        (inst,) = be.instances()
        good = inst.scheduler
        inst.scheduler = _Stuck()
        with pytest.raises(ServeError) as e:
            await collect(be, greq())
        assert (e.value.status, e.value.reason) == (500, "engine_error")
        assert "StallError" in str(e.value)
        assert inst.num_live == 0 and inst.kv.num_used_blocks == 0
        inst.scheduler = good  # the replica keeps serving
        assert len(await collect(be, greq(max_tokens=3))) == 3
        await be.stop(0)

    run(main())


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_serves_live(policy: str) -> None:
    async def main() -> None:
        be = emulated(policy=policy, time_scale=100.0)
        await be.start()
        reqs = [
            greq(
                prompt=40 + 7 * i,
                max_tokens=12,
                qoe=QoESpec(1.0, 5.0) if i % 2 else None,
                request_class=RequestClass.BE if i % 3 == 0 else RequestClass.RT,
            )
            for i in range(5)
        ]
        outs = await asyncio.gather(*(collect(be, r) for r in reqs))
        assert [len(o) for o in outs] == [12] * 5
        (inst,) = be.instances()
        assert inst.kv.num_used_blocks == 0
        await be.stop(0)

    run(main())


def test_slo_admission_refuses_what_cannot_be_met() -> None:
    async def main() -> None:
        icfg = InstanceConfig(profile="llama-2-7b@a100-80gb", max_running=1)
        be = emulated(instance=icfg, time_scale=1.0, admission="slo")
        await be.start()
        prefill_2000 = be.instances()[0].cost_model.prefill_time(2000)  # ≈ 0.15 s
        tight = SLO(ttft_s=prefill_2000 / 2)
        with pytest.raises(ServeError) as e:  # even alone it cannot prefill in time
            await collect(be, greq(prompt=2000, max_tokens=2, slo=tight))
        assert (e.value.status, e.value.reason) == (429, "deadline")
        assert "TTFT target" in str(e.value)
        ok = SLO(ttft_s=prefill_2000 * 3)
        assert len(await collect(be, greq(prompt=2000, max_tokens=2, slo=ok))) == 2
        # a deadline shorter than 100 decode steps
        with pytest.raises(ServeError) as e:
            await collect(be, greq(prompt=10, max_tokens=100, slo=SLO(deadline_s=0.05)))
        assert "deadline" in str(e.value)
        # best-effort requests are never refused for SLOs
        be_req = greq(prompt=2000, max_tokens=2, slo=tight, request_class=RequestClass.BE)
        assert len(await collect(be, be_req)) == 2
        await be.stop(0)

    run(main())


def test_drain_hands_over_the_backlog() -> None:
    """A consumer that fell behind gets every chunk produced so far without waiting, in
    order, the finish last; then the stream is over."""

    async def main() -> None:
        be = emulated(instance=CONST, time_scale=20.0)
        await be.start()
        gen = be.generate(greq(max_tokens=30))
        first = await gen.__anext__()
        assert first.text == filler_text(0)
        await asyncio.sleep(0.1)  # 30 iterations of 0.5 ms: all produced by now
        drain = getattr(gen, "drain_nowait")  # noqa: B009  (not part of AsyncIterator)
        rest = drain()
        assert [c.text for c in rest] == [filler_text(i) for i in range(1, 30)]
        assert rest[-1].finish_reason == "length" and drain() == []
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
        assert be.replicas()[0].in_flight == 0
        await be.stop(0)

    run(main())


class _FailsOnCall(Scheduler):
    """Delegates to ``inner`` until ``arm`` is set, then raises on the next call."""

    name = "fails"

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.arm = False

    def schedule(self, view: InstanceView) -> SchedulerOutput:
        if self.arm:
            self.arm = False
            raise RuntimeError("boom")
        return self.inner.schedule(view)


def test_engine_error_before_an_arrival_is_stepped_leaves_no_ghost() -> None:
    """The engine fails on an event that was due before a new request's arrival (a loop
    that fell behind): the failed engine's request ends with the error and the engine is
    left holding nothing; the new request, which arrived after the failure, is served by
    the restarted replica (the cluster's fail + recover: a fresh engine)."""

    async def main() -> None:
        be = emulated(instance=CONST, time_scale=20.0)
        await be.start()
        (inst,) = be.instances()
        fails = _FailsOnCall(inst.scheduler)
        inst.scheduler = fails
        a = be.generate(greq(max_tokens=50))
        await a.__anext__()
        fails.arm = True
        time.sleep(0.02)  # the loop falls behind: A's next iteration end is due
        assert len(await collect(be, greq(prompt=200, max_tokens=20))) == 20
        with pytest.raises(ServeError) as e:
            async for _c in a:  # the tokens produced before the error, then the error
                pass
        assert e.value.reason == "engine_error"
        await asyncio.sleep(0.02)
        assert inst.num_live == 0 and inst.kv.num_used_blocks == 0
        (fresh,) = be.instances()
        assert fresh is not inst and fresh.num_live == 0 and fresh.kv.num_used_blocks == 0
        assert be.replicas()[0].in_flight == 0
        await be.stop(0)

    run(main())
