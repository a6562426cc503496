import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from sloserve.experiments.runner import SimConfig, simulate
from sloserve.metrics.qoe import consumption_times
from sloserve.serve.pacer import TokenPacer, openai_chunk_tokens, pace
from sloserve.workloads import WorkloadSpec


async def bursty(delays: list[float]) -> AsyncIterator[int]:
    """Tokens arriving after the given pauses (a preempted server's bursts)."""
    for i, d in enumerate(delays):
        if d:
            await asyncio.sleep(d)
        yield i


def test_pacer_releases_at_reading_speed_and_never_early() -> None:
    gap = 0.02  # 50 tokens/s
    # a burst of 5, a 0.15 s pause, a burst of 5
    delays = [0.0] * 5 + [0.15] + [0.0] * 4

    async def main() -> TokenPacer[int]:
        p = pace(bursty(delays), 1 / gap)
        got = [tok async for tok in p]
        assert got == list(range(10))
        return p

    p = asyncio.run(main())
    d, r = np.array(p.delivered), np.array(p.released)
    assert np.all(r >= d - 1e-6)  # never before it arrived
    assert np.all(np.diff(r) >= gap * 0.95)  # never faster than the reader
    # and never later than the consumption model allows (plus scheduling jitter)
    model = consumption_times(0.0, d, 0.0, 1 / gap)
    assert np.all(r <= model + 0.05)


def test_pacer_forwards_source_errors_after_the_items_before_them() -> None:
    async def broken() -> AsyncIterator[int]:
        yield 1
        raise RuntimeError("upstream died")

    async def main() -> list[int]:
        got = []
        with pytest.raises(RuntimeError, match="upstream died"):
            async for tok in TokenPacer(broken(), 1000.0):
                got.append(tok)
        return got

    assert asyncio.run(main()) == [1]


def test_openai_chunks_count_one_token_per_content_delta() -> None:
    assert openai_chunk_tokens({"choices": [{"delta": {"content": "Hi"}}]}) == 1.0
    assert openai_chunk_tokens({"choices": [{"delta": {"role": "assistant"}}]}) == 0.0
    assert openai_chunk_tokens({"choices": [], "usage": {"completion_tokens": 3}}) == 0.0
    assert openai_chunk_tokens({"choices": [{"text": "x"}]}) == 1.0
    with pytest.raises(ValueError):
        TokenPacer(bursty([]), 0.0)


def test_run_results_show_delivered_and_consumed_timelines() -> None:
    res = simulate(SimConfig(workload=WorkloadSpec(duration_s=10, seed=2)))
    r = res.requests[0]
    tl = res.timeline(r.req_id)
    assert len(tl) == r.true_output_len
    assert (tl["consumed_s"] >= tl["delivered_s"]).all()
    assert (tl["consumed_s"] >= tl["expected_s"] - 1e-9).all()
    assert np.all(np.diff(tl["consumed_s"]) >= 1 / r.qoe.tokens_per_s - 1e-9)
