"""Per-request QoE reading speeds (presets, normal and choice distributions, validation)
and SLO rules (the bros / qlm / none presets, explicit per-class rules, and a preset
applied to a replayed trace)."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sloserve.core.request import SLO, RequestClass
from sloserve.workloads import QoERule, WorkloadSpec
from sloserve.workloads.spec import build_requests
from workload_helpers import (
    BE,
    RT,
    write,
)


# ============================================================================ QoE and SLOs
def speeds(qoe: QoERule | dict[str, object], n: int = 4_000, seed: int = 0) -> np.ndarray:
    spec = WorkloadSpec.model_validate(
        {
            "mix": "fixed-16-16",
            "arrival": {"kind": "constant", "rate": 100.0},
            "duration_s": None,
            "num_requests": n,
            "qoe": qoe,
            "seed": seed,
        }
    )
    reqs = build_requests(spec)
    assert all(r.qoe is not None for r in reqs)
    return np.array([r.qoe.tokens_per_s for r in reqs if r.qoe is not None])


@pytest.mark.parametrize(("preset", "mean"), [("reading", 4.8), ("listening", 3.3)])
def test_qoe_speed_presets(preset: str, mean: float) -> None:
    s = speeds({"tokens_per_s": preset})
    assert s.mean() == pytest.approx(mean, abs=0.1)
    assert s.std() == pytest.approx(0.2 * mean, rel=0.1)
    assert s.min() > 0


def test_qoe_normal_and_choice_speeds() -> None:
    s = speeds({"tokens_per_s": {"kind": "normal", "mean": 10.0, "std": 2.0, "min": 6.0}})
    assert s.min() >= 6.0
    assert np.median(s) == pytest.approx(10.0, abs=0.2)
    c = speeds({"tokens_per_s": {"kind": "choice", "values": [3.0, 6.0], "weights": [1, 3]}})
    assert set(c) == {3.0, 6.0}
    assert np.mean(c == 6.0) == pytest.approx(0.75, abs=0.03)
    u = speeds({"tokens_per_s": {"kind": "choice", "values": [2.0, 4.0, 8.0]}})
    assert set(u) == {2.0, 4.0, 8.0}
    assert set(speeds({"tokens_per_s": 7.5})) == {7.5}
    assert set(speeds({})) == {4.8}  # Andes' mean reading speed by default
    # deterministic per seed, independent of other components
    np.testing.assert_array_equal(
        speeds({"tokens_per_s": "reading"}), speeds({"tokens_per_s": "reading"})
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"tokens_per_s": "skimming"},
        {"tokens_per_s": 0},
        {"tokens_per_s": {"kind": "choice", "values": [1.0, 2.0], "weights": [1.0]}},
        {"tokens_per_s": {"kind": "choice", "values": [1.0], "weights": [0.0]}},
        {"tokens_per_s": {"kind": "normal", "mean": -1.0, "std": 1.0}},
        {"tokens_per_s": {"kind": "uniform", "low": 1, "high": 2}},
    ],
)
def test_qoe_bad_speeds(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        QoERule.model_validate(bad)


def slos(slo: object) -> dict[RequestClass, set[tuple[SLO, int]]]:
    spec = WorkloadSpec.model_validate(
        {
            "mix": "fixed-16-16",
            "num_requests": 200,
            "duration_s": None,
            "classes": {"rt": 0.5, "be": 0.5},
            "slo": slo,
        }
    )
    out: dict[RequestClass, set[tuple[SLO, int]]] = collections.defaultdict(set)
    for r in build_requests(spec):
        out[r.req_class].add((r.slo, r.priority))
    return dict(out)


def test_slo_presets() -> None:
    assert slos("bros") == {RT: {(SLO(0.4, 0.2), 0)}, BE: {(SLO(), 0)}}
    assert slos("qlm") == {RT: {(SLO(deadline_s=30.0), 0)}, BE: {(SLO(deadline_s=300.0), 0)}}
    assert slos("none") == {RT: {(SLO(), 0)}, BE: {(SLO(), 0)}}


def test_slo_explicit_rules() -> None:
    got = slos({"be": {"deadline_s": 60.0, "priority": 2}})
    assert got == {RT: {(SLO(0.4, 0.2), 0)}, BE: {(SLO(deadline_s=60.0), 2)}}
    got = slos({"rt": {"ttft_s": 1.0}, "be": {}})
    assert got == {RT: {(SLO(ttft_s=1.0), 0)}, BE: {(SLO(), 0)}}
    for bad in ("bogus", {"rt": {"ttft_s": -1}}, {"vip": {}}, {"rt": {"latency": 1}}):
        with pytest.raises(ValidationError):
            WorkloadSpec(slo=bad)  # type: ignore[arg-type]


def test_slo_preset_applies_to_a_replayed_trace(tmp_path: Path) -> None:
    p = write(
        tmp_path / "t.csv", "arrival_s,prompt_tokens,output_tokens,class\n0,1,1,rt\n1,2,2,be\n"
    )
    reqs = build_requests(WorkloadSpec(trace=str(p), slo="qlm"))
    assert [r.slo for r in reqs] == [SLO(deadline_s=30.0), SLO(deadline_s=300.0)]
