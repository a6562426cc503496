"""Synthetic workload shapes: the published length mixes (Andes Table 2, fixed lengths,
InferMax's two-group mix) and diurnal arrivals (mean rate, peak-to-trough ratio,
determinism, and use in a spec)."""

from __future__ import annotations

import numpy as np
import pytest

from sloserve.core.request import Request
from sloserve.workloads import ConstantArrivals, WorkloadSpec
from sloserve.workloads.arrivals import DiurnalArrivals
from sloserve.workloads.spec import build_requests
from workload_helpers import (
    RT,
    pairs,
)


# ============================================================================ mixes
def many(mix: str, n: int = 20_000, seed: int = 0) -> list[Request]:
    spec = WorkloadSpec(
        mix=mix, arrival=ConstantArrivals(rate=1000.0), duration_s=None, num_requests=n, seed=seed
    )
    return build_requests(spec, max_context=None)


# Andes Table 2: (input mean, output mean)
ANDES_TABLE_2 = {
    "andes-sharegpt": (3171, 385),
    "arxiv-summarization": (17855, 605),
    "coding-challenges": (675, 5423),
}


@pytest.mark.parametrize("mix", sorted(ANDES_TABLE_2))
def test_andes_mixes_match_table_2(mix: str) -> None:
    reqs = many(mix)
    p = np.array([r.num_prompt_tokens for r in reqs], dtype=np.float64)
    o = np.array([r.true_output_len for r in reqs], dtype=np.float64)
    pm, om = ANDES_TABLE_2[mix]
    # lognormals with std up to 4x the mean: generous tolerances
    assert p.mean() == pytest.approx(pm, rel=0.12)
    assert o.mean() == pytest.approx(om, rel=0.15)
    assert p.min() >= 1 and o.min() >= 1
    assert all(r.req_class is RT for r in reqs)


def test_fixed_mix() -> None:
    reqs = many("fixed-512-128", n=100)
    assert set(pairs(reqs)) == {(512, 128)}


def test_infermax_two_group_mix() -> None:
    reqs = many("infermax-siso+lilo", n=4_000)
    ps = pairs(reqs)
    short = [(p, o) for p, o in ps if p in (8, 16)]
    long_ = [(p, o) for p, o in ps if p in (512, 1024)]
    assert len(short) + len(long_) == len(ps)
    assert all(o in (8, 16) for _, o in short)  # siso: short in, short out
    assert all(o in (512, 1024) for _, o in long_)  # lilo: long in, long out
    assert len(short) / len(ps) == pytest.approx(0.5, abs=0.05)
    assert set(short) == {(8, 8), (8, 16), (16, 8), (16, 16)}
    assert set(long_) == {(512, 512), (512, 1024), (1024, 512), (1024, 1024)}


# ============================================================================ arrivals
def test_diurnal_mean_rate_and_peak_to_trough() -> None:
    amp, period, rate = 0.5, 1_000.0, 2.0
    proc = DiurnalArrivals(rate=rate, amplitude=amp, period_s=period)
    periods = 100
    t = proc.times(np.random.default_rng(0), periods * period, None)
    assert np.all(np.diff(t) >= 0) and t.min() >= 0 and t.max() < periods * period
    assert t.size / (periods * period) == pytest.approx(rate, rel=0.02)
    phase = np.mod(t, period) / period
    # sin peaks at a quarter period and bottoms out at three quarters
    peak = np.count_nonzero(np.abs(phase - 0.25) < 0.02)
    trough = np.count_nonzero(np.abs(phase - 0.75) < 0.02)
    assert peak / trough == pytest.approx((1 + amp) / (1 - amp), rel=0.1)
    # same seed, same times; count cap
    again = proc.times(np.random.default_rng(0), periods * period, None)
    np.testing.assert_array_equal(t, again)
    assert proc.times(np.random.default_rng(1), None, 500).size == 500


def test_diurnal_in_a_spec() -> None:
    spec = WorkloadSpec.model_validate(
        {
            "mix": "lmsys",
            "arrival": {"kind": "diurnal", "rate": 4.0, "amplitude": 0.8, "period_s": 100.0},
            "duration_s": 1_000,
        }
    )
    reqs = build_requests(spec)
    assert len(reqs) / 1_000 == pytest.approx(4.0, rel=0.08)
