"""Trace replay options (``ReplayOptions`` and the spec fields that shape a replay):
time windows, speed-up, deterministic sampling, context caps (clip / drop),
request-count and duration caps, notes on unused fields, their validation, and
``trace_use='lengths'``. The real trace used here is the Azure LLM inference trace 2023 (conversation service,
one hour, 19,366 requests), Microsoft Azure Public Dataset (Azure/AzurePublicDataset),
licensed CC-BY 4.0; it is read from the shared folder next to the repository and never
copied into it; its tests are skipped without it."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from sloserve.core.errors import WorkloadError
from sloserve.workloads import PoissonArrivals, WorkloadSpec
from sloserve.workloads.loaders import (
    TraceTable,
)
from sloserve.workloads.spec import ReplayOptions, build_requests, build_workload
from workload_helpers import (
    arrivals,
    azure_spec,
    needs_azure,
    pairs,
)


# ============================================================================ replay options
@needs_azure
def test_replay_window_rezeroes_arrivals(azure: TraceTable) -> None:
    a = azure.df["arrival_s"].to_numpy()
    inside = (a >= 600) & (a < 900)
    w = build_workload(azure_spec(replay=ReplayOptions(start_s=600, end_s=900)))
    assert len(w.requests) == int(inside.sum()) > 1000
    np.testing.assert_allclose(arrivals(w.requests), a[inside] - 600, rtol=0, atol=1e-9)
    assert arrivals(w.requests).min() >= 0 and arrivals(w.requests).max() < 300
    assert pairs(w.requests)[0] == (
        azure.df["prompt_tokens"][inside].iloc[0],
        azure.df["output_tokens"][inside].iloc[0],
    )
    assert f"window [600.0, 900.0) s keeps {int(inside.sum())} of 19366 requests" in w.notes


@needs_azure
def test_replay_speedup_divides_arrivals(azure: TraceTable) -> None:
    a = azure.df["arrival_s"].to_numpy()
    w = build_workload(azure_spec(replay=ReplayOptions(end_s=400, speedup=4)))
    np.testing.assert_allclose(arrivals(w.requests), a[a < 400] / 4, rtol=0, atol=1e-9)
    assert arrivals(w.requests).max() < 100
    assert "replayed 4.0× faster" in w.notes


@needs_azure
def test_replay_sample_is_deterministic_and_about_the_fraction(azure: TraceTable) -> None:
    n = len(azure.df)
    w0 = build_workload(azure_spec(replay=ReplayOptions(sample=0.25), seed=0))
    again = build_workload(azure_spec(replay=ReplayOptions(sample=0.25), seed=0))
    w1 = build_workload(azure_spec(replay=ReplayOptions(sample=0.25), seed=1))
    assert arrivals(w0.requests).tolist() == arrivals(again.requests).tolist()
    assert arrivals(w0.requests).tolist() != arrivals(w1.requests).tolist()
    for w in (w0, w1):
        assert len(w.requests) / n == pytest.approx(0.25, abs=0.015)
        # a subset of the trace's rows, in order, at their own times
        assert set(arrivals(w.requests)) <= set(azure.df["arrival_s"])
        assert np.all(np.diff(arrivals(w.requests)) >= 0)
        assert f"sampled 25%: {len(w.requests)} requests" in w.notes
    # ids are renumbered 0..n-1
    assert [r.req_id for r in w0.requests[:5]] == [0, 1, 2, 3, 4]


@needs_azure
@pytest.mark.parametrize("cap", ["clip", "drop"])
def test_replay_max_context(azure: TraceTable, cap: str) -> None:
    total = azure.df["prompt_tokens"] + azure.df["output_tokens"]
    over = int((total > 4096).sum())
    assert over > 1000
    w = build_workload(azure_spec(replay=ReplayOptions(max_context=4096, cap=cap)))
    assert max(p + o for p, o in pairs(w.requests)) <= 4096
    assert min(o for _, o in pairs(w.requests)) >= 1
    if cap == "clip":
        assert len(w.requests) == len(azure.df)
        assert f"clipped {over} request(s) to 4096 tokens" in w.notes
    else:
        assert len(w.requests) == len(azure.df) - over
        assert f"dropped {over} request(s) longer than 4096 tokens" in w.notes


@needs_azure
def test_replay_num_requests_caps(azure: TraceTable) -> None:
    w = build_workload(azure_spec(num_requests=100))
    assert len(w.requests) == 100
    np.testing.assert_array_equal(arrivals(w.requests), azure.df["arrival_s"].to_numpy()[:100])
    assert "first 100 requests kept" in w.notes


@needs_azure
def test_replay_explicit_duration_windows_the_trace(azure: TraceTable) -> None:
    a = azure.df["arrival_s"].to_numpy()
    w = build_workload(azure_spec(duration_s=60))
    assert len(w.requests) == int((a < 60).sum())
    assert arrivals(w.requests).max() < 60
    assert any(n.startswith("window [0.0, 60.0) s keeps") for n in w.notes)
    # the default duration (600 s) does not apply to a trace
    assert WorkloadSpec().duration_s == 600.0
    assert len(build_requests(azure_spec(num_requests=19_366))) == 19_366


@needs_azure
def test_replay_notes_fields_not_used(azure: TraceTable) -> None:
    w = build_workload(azure_spec(mix="lmsys", num_requests=3))
    assert "replaying azure:azure_llm_2023_conv.csv: mix not used" in w.notes


@needs_azure
def test_replay_empty_after_options(azure: TraceTable) -> None:
    with pytest.raises(WorkloadError, match="no request left to replay"):
        build_requests(azure_spec(replay=ReplayOptions(start_s=5_000)))


def test_replay_window_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="end_s"):
        ReplayOptions(start_s=10, end_s=5)
    for bad in (
        {"speedup": 0},
        {"speedup": -1},
        {"sample": 0},
        {"sample": 1.5},
        {"max_context": 1},
    ):
        with pytest.raises(ValidationError):
            ReplayOptions(**bad)  # type: ignore[arg-type]


@needs_azure
def test_trace_use_lengths_draws_pairs_with_synthetic_arrivals(azure: TraceTable) -> None:
    spec = azure_spec(trace_use="lengths", arrival=PoissonArrivals(rate=2.0), duration_s=200)
    w = build_workload(spec)
    assert 330 < len(w.requests) < 470
    a = arrivals(w.requests)
    assert a.max() < 200 and np.all(np.diff(a) >= 0)
    trace_pairs = set(zip(azure.df["prompt_tokens"], azure.df["output_tokens"], strict=True))
    assert set(pairs(w.requests)) <= trace_pairs
    # drawn, not the trace's first rows in order
    first = list(zip(azure.df["prompt_tokens"][:20], azure.df["output_tokens"][:20], strict=True))
    assert pairs(w.requests)[:20] != first
    p = np.array([x for x, _ in pairs(w.requests)])
    assert p.mean() == pytest.approx(1_155, rel=0.15)
    assert pairs(build_requests(spec)) == pairs(w.requests)
