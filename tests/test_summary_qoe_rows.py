"""The request table's QoE column, computed for requests of equal length as the rows of a
2-D array (``metrics/summary._delivered_qoes``), is ``delivered_qoe`` of each request bit
for bit; and the numpy property it rests on (a C-contiguous row reduced along the last axis
is summed as the same values in a 1-D array) holds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.core.request import QoESpec, Request, RequestStatus
from sloserve.metrics import summary as summary_mod
from sloserve.metrics.qoe import andes_qoe, delivered_qoe


def _bits(a: np.ndarray) -> list[int]:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64).tolist()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 40),
    m=st.one_of(st.integers(1, 300), st.sampled_from([511, 512, 513, 1000, 1025, 4100])),
    seed=st.integers(0, 2**32 - 1),
)
def test_row_sums_are_the_1d_sums(rows: int, m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Wide magnitudes: any other order of additions than numpy's 1-D pairwise one shows.
    a = rng.standard_normal((rows, m)) * 10.0 ** rng.integers(-8, 9, (rows, m))
    assert _bits(np.add.reduce(a, axis=1)) == _bits(np.array([np.add.reduce(r) for r in a]))


def test_the_row_sum_check_can_fail() -> None:
    """A column-major array's rows are summed another way: the check above has teeth."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((300, 200)) * 10.0 ** rng.integers(-8, 9, (300, 200))
    f = np.asfortranarray(a)
    assert _bits(np.add.reduce(f, axis=1)) != _bits(np.array([np.add.reduce(r) for r in a]))


def _served(
    rng: np.random.Generator, n_req: int, lengths: list[int], speeds: list[float]
) -> tuple[list[Request], dict[int, np.ndarray]]:
    """Finished requests on one replica whose log has a token per iteration, in runs."""
    log: list[float] = []
    reqs = []
    t = 0.0
    for i in range(n_req):
        m = lengths[i % len(lengths)]
        arrival = t
        runs: list[int] = []
        k = 0
        while k < m:  # the tokens in runs of 1-5 iterations, gaps of other iterations
            run = min(m - k, int(rng.integers(1, 6)))
            for _ in range(int(rng.integers(0, 3))):
                t += float(rng.exponential(0.05))
                log.append(t)
            start = len(log)
            for _ in range(run):
                t += float(rng.exponential(0.05)) * 10.0 ** int(rng.integers(-3, 2))
                log.append(t)
            runs += [start, len(log) - 1]
            k += run
        r = Request(
            req_id=i,
            arrival=arrival,
            num_prompt_tokens=8,
            true_output_len=m,
            qoe=QoESpec(float(rng.uniform(0, 2)), speeds[i % len(speeds)]),
        )
        r.status = RequestStatus.FINISHED
        r.token_runs = runs
        r.num_output_tokens = m
        r.instance_id = 0
        r.finish_time = log[-1]
        reqs.append(r)
        t = arrival + float(rng.exponential(0.3))
        t = max(t, log[-1] - 5.0)
    return reqs, {0: np.asarray(log)}


@pytest.mark.parametrize("chunk", [1024, 3])
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    lengths=st.lists(st.integers(1, 140), min_size=1, max_size=6),
    speeds=st.lists(st.floats(0.5, 40.0), min_size=1, max_size=3),
)
def test_qoe_column_is_delivered_qoe(
    chunk: int, seed: int, lengths: list[int], speeds: list[float]
) -> None:
    rng = np.random.default_rng(seed)
    reqs, ends = _served(rng, 40, lengths, speeds)
    old = summary_mod._QOE_CHUNK
    summary_mod._QOE_CHUNK = chunk  # (monkeypatch does not mix with @given)
    try:
        cols = summary_mod.request_columns(reqs, ends)
    finally:
        summary_mod._QOE_CHUNK = old
    for r, q in zip(reqs, cols["qoe"], strict=True):
        t = summary_mod.token_times(r, ends[0])
        assert r.qoe is not None
        want = delivered_qoe(r.arrival, t, r.qoe.ttft_s, r.qoe.tokens_per_s)
        assert _bits(np.array([q])) == _bits(np.array([want]))
        assert want == andes_qoe(r.arrival, t, r.qoe.ttft_s, r.qoe.tokens_per_s)


def test_qoe_column_mixes_the_cases_done_one_by_one() -> None:
    """Rejected (0), in flight (andes_qoe at the abort), no spec (NaN) and finished
    requests side by side: each gets its own rule, the finished ones the batched value."""
    rng = np.random.default_rng(11)
    reqs, ends = _served(rng, 12, [3, 7, 7, 20], [4.0])
    reqs[1].status = RequestStatus.REJECTED
    reqs[2].status = RequestStatus.ABORTED
    reqs[3].qoe = None
    cols = summary_mod.request_columns(reqs, ends)
    q = cols["qoe"]
    assert q[1] == 0.0 and q[3] != q[3]
    r = reqs[2]
    assert r.qoe is not None and r.finish_time is not None
    t = summary_mod.token_times(r, ends[0])
    assert q[2] == andes_qoe(
        r.arrival, t, r.qoe.ttft_s, r.qoe.tokens_per_s, now=r.finish_time,
        total_tokens=r.true_output_len,
    )  # fmt: skip
    for k in (0, 4, 5, 6, 7, 8, 9, 10, 11):
        r = reqs[k]
        assert r.qoe is not None
        t = summary_mod.token_times(r, ends[0])
        assert q[k] == delivered_qoe(r.arrival, t, r.qoe.ttft_s, r.qoe.tokens_per_s)
