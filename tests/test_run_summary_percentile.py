"""``metrics/run_summary.percentile`` gives ``np.percentile``'s floats exactly (the run
summary's quantiles, without ``np.percentile``'s import of ``numpy.ma``)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.metrics.run_summary import percentile

FLOATS = st.floats(allow_nan=False, allow_infinity=True, width=64)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (
        a == b and math.copysign(1, a) == math.copysign(1, b)
    )


@settings(max_examples=400, deadline=None)
@given(
    st.lists(FLOATS, min_size=1, max_size=60),
    st.sampled_from([0, 1, 10, 25, 50, 90, 99, 99.9, 100]),
)
def test_matches_numpy_bit_for_bit(values: list[float], p: float) -> None:
    v = np.asarray(values, dtype=np.float64)
    assert same(percentile(np.sort(v), p), float(np.percentile(v, p)))


def test_large_random_columns() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 100, 16384, 100_001):
        v = rng.lognormal(0.0, 2.0, n) * rng.choice([-1.0, 1.0], n)
        s = np.sort(v)
        for p in (10, 50, 90, 99):
            assert same(percentile(s, p), float(np.percentile(v, p)))


def test_signed_zero_and_ties() -> None:
    for v in ([-0.0], [0.0, -0.0], [-0.0, -0.0, 1.0], [5.0] * 9, [math.inf], [-math.inf, 1.0]):
        a = np.asarray(v)
        for p in (10, 50, 90, 99, 100):
            assert same(percentile(np.sort(a), p), float(np.percentile(a, p))), (v, p)


def test_percentile_of_no_values_is_a_clear_error() -> None:
    import numpy as np
    import pytest

    from sloserve.metrics.run_summary import percentile

    with pytest.raises(ValueError, match="no values"):
        percentile(np.array([], dtype=np.float64), 50)
