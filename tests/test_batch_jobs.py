"""Closed-loop batch jobs (``BatchJobs``): waves of best-effort requests submitted after
the previous wave finishes, bounded by a count or the duration, identical across
compared policies, safe when every batch is rejected, and following the QoE rule."""

from __future__ import annotations

import collections
import contextlib
import itertools

import numpy as np
import pytest
from pydantic import ValidationError

from sloserve.core.errors import SloserveError
from sloserve.core.request import SLO, Request
from sloserve.experiments import runner
from sloserve.experiments.runner import InstanceConfig, SimConfig, compare, simulate
from sloserve.workloads import PoissonArrivals, QoERule, WorkloadSpec
from sloserve.workloads.spec import BatchJobs
from workload_helpers import (
    BE,
    RT,
)

# simulated time does not depend on the (concurrently re-fitted) profile cost model
FAST = InstanceConfig(cost_model="constant:0.01")


# ============================================================================ batch jobs
def batch_cfg(jobs: BatchJobs, duration: float = 20.0, **wl: object) -> SimConfig:
    return SimConfig(
        workload=WorkloadSpec(
            mix="sharegpt",
            arrival=PoissonArrivals(rate=1.0),
            duration_s=duration,
            batch_jobs=jobs,
            **wl,  # type: ignore[arg-type]
        ),
        instance=FAST,
    )


def waves(reqs: list[Request]) -> list[list[Request]]:
    by_time: dict[float, list[Request]] = collections.defaultdict(list)
    for r in reqs:
        if r.req_class is BE:
            by_time[r.arrival].append(r)
    return [by_time[t] for t in sorted(by_time)]


def test_batch_jobs_closed_loop_waves() -> None:
    cfg = batch_cfg(BatchJobs(batch_size=8, num_batches=3, gap_s=0.5, start_s=1.0))
    open_loop = runner.workload_requests(cfg)
    assert all(r.req_class is RT for r in open_loop)
    res = simulate(cfg)
    be = [r for r in res.requests if r.req_class is BE]
    assert len(be) == 24
    assert len(res.requests) == len(open_loop) + 24
    assert len({r.req_id for r in res.requests}) == len(res.requests)
    assert min(r.req_id for r in be) == len(open_loop)  # ids continue after the open loop
    ws = waves(res.requests)
    assert [len(w) for w in ws] == [8, 8, 8]
    assert ws[0][0].arrival == 1.0
    for prev, cur in itertools.pairwise(ws):
        last = max(r.finish_time for r in prev if r.finish_time is not None)
        assert cur[0].arrival >= last + 0.5 - 1e-9
        assert cur[0].arrival == pytest.approx(last + 0.5)
    assert all(r.finish_time is not None for r in be)
    # be-synthetic lengths (BROS §7.1) and the BE rule
    assert all(512 <= r.num_prompt_tokens <= 1024 and 32 <= r.true_output_len <= 128 for r in be)
    assert all(r.slo == SLO() for r in be)
    assert int((res.table["class"] == "be").sum()) == 24


def test_batch_jobs_until_duration() -> None:
    cfg = batch_cfg(BatchJobs(batch_size=4, gap_s=1.0), duration=20.0)
    res = simulate(cfg)
    ws = waves(res.requests)
    assert len(ws) >= 3
    assert all(len(w) == 4 for w in ws)
    assert all(w[0].arrival < 20.0 for w in ws)
    # the batch after the last would have arrived at or after duration_s
    last_finish = max(r.finish_time for r in ws[-1] if r.finish_time is not None)
    assert last_finish + 1.0 >= 20.0
    for prev, cur in itertools.pairwise(ws):
        assert cur[0].arrival == pytest.approx(max(r.finish_time or 0 for r in prev) + 1.0)


def test_batch_jobs_need_a_bound() -> None:
    with pytest.raises(ValidationError, match="num_batches"):
        WorkloadSpec(num_requests=5, duration_s=None, batch_jobs=BatchJobs())
    with pytest.raises(ValidationError):
        BatchJobs(mix="nope")
    with pytest.raises(ValidationError):
        BatchJobs(batch_size=0)


def test_batch_jobs_compare_same_first_batch() -> None:
    cfg = batch_cfg(BatchJobs(batch_size=8, num_batches=3))
    results = compare(cfg, ["vllm", "sarathi", "edf"])

    def key(reqs: list[Request]) -> list[tuple[object, ...]]:
        return [(r.req_id, r.arrival, r.num_prompt_tokens, r.true_output_len) for r in reqs]

    firsts = {name: key(waves(res.requests)[0]) for name, res in results.items()}
    assert len(firsts["vllm"]) == 8
    assert firsts["vllm"] == firsts["sarathi"] == firsts["edf"]
    opens = {
        name: key([r for r in res.requests if r.req_class is RT]) for name, res in results.items()
    }
    assert opens["vllm"] == opens["sarathi"] == opens["edf"]
    assert all(sum(r.req_class is BE for r in res.requests) == 24 for res in results.values())
    # and the same as a plain simulate of the same config
    assert key(waves(simulate(cfg).requests)[0]) == firsts["vllm"]


def test_batch_jobs_all_rejected_do_not_loop_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = runner.batch_job_requests

    def counted(*args: object, **kw: object) -> list[Request]:
        nonlocal calls
        calls += 1
        if calls > 200:
            raise RuntimeError("runaway batch submission")
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "batch_job_requests", counted)
    cfg = SimConfig(
        workload=WorkloadSpec(
            mix="fixed-16-16", num_requests=2, duration_s=5, batch_jobs=BatchJobs(batch_size=2)
        ),
        instance=InstanceConfig(cost_model="constant:0.01", kv_capacity_tokens=256, block_size=16),
    )
    with contextlib.suppress(SloserveError):  # refusing the config is a fix too
        simulate(cfg)
    assert calls <= 200


def test_batch_jobs_follow_the_qoe_speed_rule() -> None:
    cfg = batch_cfg(BatchJobs(batch_size=200, num_batches=1), qoe=QoERule(tokens_per_s="listening"))
    be = [r for r in simulate(cfg).requests if r.req_class is BE]
    s = np.array([r.qoe.tokens_per_s for r in be if r.qoe is not None])
    assert s.mean() == pytest.approx(3.3, abs=0.3)


def test_num_batches_and_duration_whichever_ends_first() -> None:
    """Like open-loop arrivals with num_requests and duration_s: no batch starts after
    duration_s, however large num_batches is (a huge count once ran on for ever)."""
    cfg = batch_cfg(BatchJobs(batch_size=4, num_batches=77_847_089), duration=3.0)
    res = simulate(cfg)
    be = [r for r in res.requests if r.req_class is BE]
    assert be and max(r.arrival for r in be) < 3.0
    assert len(be) % 4 == 0 and len(be) < 4 * 1000
    # num_batches still ends it first when it is the smaller bound
    few = simulate(batch_cfg(BatchJobs(batch_size=4, num_batches=2), duration=30.0))
    assert len([r for r in few.requests if r.req_class is BE]) == 8
