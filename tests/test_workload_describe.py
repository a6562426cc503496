"""Workload statistics and export (``describe`` / ``export_trace`` / ``requests_frame``):
length and rate statistics, rate over time, the Azure trace's figures, and exporting
a workload then replaying it unchanged. The real trace used here is the Azure LLM inference trace 2023 (conversation service,
one hour, 19,366 requests), Microsoft Azure Public Dataset (Azure/AzurePublicDataset),
licensed CC-BY 4.0; it is read from the shared folder next to the repository and never
copied into it; its tests are skipped without it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sloserve.core.errors import WorkloadError
from sloserve.core.request import SLO, Request
from sloserve.workloads import PoissonArrivals, QoERule, WorkloadSpec
from sloserve.workloads.describe import describe, export_trace, requests_frame
from sloserve.workloads.loaders import (
    TraceTable,
)
from sloserve.workloads.spec import build_requests
from workload_helpers import (
    BE,
    RT,
    arrivals,
    azure_spec,
    needs_azure,
    pairs,
    write,
)


# ============================================================================ describe / export
def sample_workload() -> list[Request]:
    spec = WorkloadSpec(
        mix="sharegpt",
        arrival=PoissonArrivals(rate=3.0),
        duration_s=100,
        classes={RT: 0.7, BE: 0.3},
        slo={RT: {"ttft_s": 0.5, "tpot_s": 0.1, "priority": 1}, BE: {"deadline_s": 100.0}},  # type: ignore[dict-item]
        qoe=QoERule(tokens_per_s="reading"),
        seed=3,
    )
    return build_requests(spec)


def covered(rot: dict[str, object], span: float) -> np.ndarray:
    """The seconds each rate-over-time bin covers (the last one is cut short)."""
    starts = np.asarray(rot["start_s"], dtype=np.float64)
    return np.minimum(starts + float(rot["bin_s"]), span) - starts  # type: ignore[arg-type]


def test_describe_stats() -> None:
    reqs = sample_workload()
    d = describe(reqs)
    n = len(reqs)
    a = arrivals(reqs)
    p = np.array([r.num_prompt_tokens for r in reqs], dtype=np.float64)
    o = np.array([r.true_output_len for r in reqs], dtype=np.float64)
    assert d["requests"] == n
    assert d["span_s"] == pytest.approx(a.max() - a.min())
    assert d["mean_rate_per_s"] == pytest.approx(n / (a.max() - a.min()))
    assert d["mean_rate_per_s"] == pytest.approx(3.0, rel=0.15)
    assert d["interarrival_cv"] == pytest.approx(1.0, abs=0.15)  # Poisson
    for key, v in (("prompt_tokens", p), ("output_tokens", o), ("total_tokens", p + o)):
        s = d[key]
        assert s["mean"] == pytest.approx(v.mean())
        assert s["std"] == pytest.approx(v.std())
        assert (s["min"], s["max"]) == (v.min(), v.max())
        for q in (50, 90, 99):
            assert s[f"p{q}"] == pytest.approx(np.percentile(v, q))
        assert s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"]
    n_be = sum(r.req_class is BE for r in reqs)
    assert d["classes"] == {"be": n_be, "rt": n - n_be}
    assert 0.2 < n_be / n < 0.4
    assert d["models"] == {"default": n}
    assert d["slo"] == {"ttft_slo_s": 0.5, "tpot_slo_s": 0.1, "deadline_s": 100.0}
    assert d["qoe_tokens_per_s"]["mean"] == pytest.approx(4.8, abs=0.25)
    rot = d["rate_over_time"]
    assert rot["bin_s"] == 5.0  # about 20 bins of a readable width
    assert len(rot["start_s"]) == len(rot["rate_per_s"]) == 20
    assert rot["start_s"][:3] == [0.0, 5.0, 10.0]
    rates = np.asarray(rot["rate_per_s"])
    assert float(rates @ covered(rot, d["span_s"])) == pytest.approx(n)
    assert float(rates.sum() * rot["bin_s"]) == pytest.approx(n, rel=0.05)
    json.dumps(d, allow_nan=False)  # plain JSON


def test_describe_explicit_bin_and_errors() -> None:
    reqs = sample_workload()
    d = describe(reqs, bin_s=7.0)
    rot = d["rate_over_time"]
    assert rot["bin_s"] == 7.0
    assert np.diff(rot["start_s"]).tolist() == [7.0] * (len(rot["start_s"]) - 1)
    assert float(np.asarray(rot["rate_per_s"]) @ covered(rot, d["span_s"])) == pytest.approx(
        len(reqs)
    )
    with pytest.raises(WorkloadError, match="no requests"):
        describe([])


def test_describe_all_at_once_rate_is_finite() -> None:
    reqs = [
        Request(req_id=i, arrival=0.0, num_prompt_tokens=10, true_output_len=5) for i in range(8)
    ]
    d = describe(reqs)
    assert d["mean_rate_per_s"] is None
    assert d["rate_over_time"]["rate_per_s"] == []  # no rate over a zero span


@needs_azure
def test_describe_azure(azure: TraceTable) -> None:
    reqs = build_requests(azure_spec())
    d = describe(reqs)
    assert d["requests"] == 19_366
    assert d["mean_rate_per_s"] == pytest.approx(5.5, abs=0.1)
    assert d["prompt_tokens"]["mean"] == pytest.approx(1_155, abs=1)
    assert d["prompt_tokens"]["max"] == 14_050
    assert d["output_tokens"]["max"] == 1_000
    assert d["classes"] == {"rt": 19_366}
    rot = d["rate_over_time"]
    assert rot["bin_s"] == 300.0
    assert float(np.asarray(rot["rate_per_s"]) @ covered(rot, d["span_s"])) == pytest.approx(19_366)


def test_export_then_replay_round_trips(tmp_path: Path) -> None:
    reqs = sample_workload()
    out = export_trace(reqs, tmp_path / "sub" / "w.csv")
    assert out == tmp_path / "sub" / "w.csv" and out.is_file()
    back = build_requests(WorkloadSpec(trace=str(out), slo="none"))
    assert len(back) == len(reqs)
    np.testing.assert_allclose(arrivals(back), arrivals(reqs), rtol=1e-8, atol=0)
    assert pairs(back) == pairs(reqs)
    assert [r.req_class for r in back] == [r.req_class for r in reqs]
    assert [r.priority for r in back] == [r.priority for r in reqs]
    assert [r.model for r in back] == [r.model for r in reqs]
    assert [r.slo for r in back] == [r.slo for r in reqs]
    assert {r.slo for r in back} == {SLO(0.5, 0.1), SLO(deadline_s=100.0)}
    # exporting the replayed requests gives the same file
    again = export_trace(back, tmp_path / "again.csv")
    assert again.read_text() == out.read_text()
    cols = pd.read_csv(out).columns.tolist()
    assert cols == [
        "arrival_s", "prompt_tokens", "output_tokens", "class", "priority", "model",
        "ttft_slo_s", "tpot_slo_s", "deadline_s", "qoe_ttft_s", "qoe_tokens_per_s",
    ]  # fmt: skip
    # the QoE targets (reading speeds drawn per request) come back too
    assert [r.qoe for r in back] == [r.qoe for r in reqs]


def test_export_round_trips_arrivals_exactly(tmp_path: Path) -> None:
    reqs = sample_workload()
    back = build_requests(
        WorkloadSpec(trace=str(export_trace(reqs, tmp_path / "w.csv")), slo="none")
    )
    assert arrivals(back).tolist() == arrivals(reqs).tolist()


def test_export_unwritable(tmp_path: Path) -> None:
    blocker = write(tmp_path / "file", "x")
    with pytest.raises(WorkloadError, match="cannot write the trace"):
        export_trace(sample_workload()[:3], blocker / "w.csv")


def test_requests_frame_columns() -> None:
    reqs = sample_workload()[:5]
    df = requests_frame(reqs)
    assert len(df) == 5
    assert df["arrival_s"].tolist() == arrivals(reqs).tolist()
    be = df[df["class"] == "be"]
    assert be["ttft_slo_s"].isna().all() and (be["deadline_s"] == 100.0).all()
