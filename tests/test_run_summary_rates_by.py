"""``rates_by``'s vectorised path (a few keys) gives what its one-pass grouping gives:
the same groups, representatives, order and means."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.metrics import run_summary

KEY = st.one_of(
    st.sampled_from(["rt", "be", "critical", "batch", "a", "b"]),
    st.none(),
    st.just(math.nan),
    st.sampled_from([1, 1.0, True, 2]),  # equal keys of other types: one group
)


def _both(keys: list[object], values: np.ndarray) -> tuple[object, object]:
    fast = run_summary.rates_by(keys, values)
    old = run_summary._FEW_KEYS
    run_summary._FEW_KEYS = -1  # the one-pass grouping for any number of keys
    try:
        slow = run_summary.rates_by(keys, values)
    finally:
        run_summary._FEW_KEYS = old
    return fast, slow


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(KEY, st.sampled_from([0.0, 1.0, math.nan])), max_size=40))
def test_few_keys_path_is_the_grouping(rows: list[tuple[object, float]]) -> None:
    keys = [k for k, _ in rows]
    values = np.asarray([v for _, v in rows], dtype=np.float64)
    real = [k for k in keys if k is not None and k == k]
    if any(isinstance(k, str) for k in real) and any(isinstance(k, (int, float)) for k in real):
        with pytest.raises(TypeError):  # both sort the keys: mixed types do not sort
            run_summary.rates_by(keys, values)
        return
    fast, slow = _both(keys, values)
    assert repr(fast) == repr(slow)  # (NaN means compare equal as text)


def test_an_object_array_of_classes_groups_alike() -> None:
    keys = np.asarray(["rt", "be", "rt", None, "be", "rt"], dtype=object)
    values = np.asarray([1.0, 0.0, 0.0, 1.0, 1.0, math.nan])
    fast, slow = _both(list(keys), values)
    assert fast == slow == {"be": 0.5, "rt": 0.5}
