"""Andes QoE (§3.1): the four cases of Figure 5, hand-computed, and in-flight scoring."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.metrics.qoe import andes_qoe, consumption_times

# arrival 0, TTFT target 1 s, 1 token/s: the ideal timeline is T = 1, 2, 3, 4


def test_figure5a_perfect_experience() -> None:
    assert andes_qoe(0.0, [1, 2, 3, 4], 1.0, 1.0) == 1.0
    assert andes_qoe(0.0, [0.5, 0.6, 0.7, 0.8], 1.0, 1.0) == 1.0  # early tokens don't help


def test_figure5b_long_initial_delay() -> None:
    # A = 3,4,5,6: S_delay = 8, S_whole = 5+4+3+2 = 14
    assert andes_qoe(0.0, [3, 4, 5, 6], 1.0, 1.0) == pytest.approx(1 - 8 / 14)


def test_figure5c_slow_streaming() -> None:
    # A = 1,3,5,7: S_delay = 0+1+2+3 = 6, S_whole = 6+5+4+3 = 18
    assert andes_qoe(0.0, [1, 3, 5, 7], 1.0, 1.0) == pytest.approx(1 - 6 / 18)


def test_figure5d_long_pause_in_the_middle() -> None:
    # A = 1,2,6,7: S_delay = 0+0+3+3 = 6, S_whole = 18
    assert andes_qoe(0.0, [1, 2, 6, 7], 1.0, 1.0) == pytest.approx(1 - 6 / 18)
    # a burst after the pause is consumed at reading speed, not at delivery time
    np.testing.assert_allclose(consumption_times(0.0, [1, 2, 6, 6, 6], 1.0, 1.0), [1, 2, 6, 7, 8])


def test_in_flight_scoring() -> None:
    assert andes_qoe(0.0, [], 1.0, 1.0, now=5.0) == 0.0  # nothing delivered, T_1 passed
    assert andes_qoe(0.0, [], 1.0, 1.0, now=0.5) == 1.0  # nothing expected yet
    # delivered 1, 2; by now=5 tokens 3..5 are expected and consumed at 5:
    # A = 1,2,5,5,5; S_delay = 2+1+0 = 3; S_whole = 4+3+2+1+0 = 10
    assert andes_qoe(0.0, [1, 2], 1.0, 1.0, now=5.0) == pytest.approx(0.7)
    # tokens after `now` are not yet delivered
    assert andes_qoe(0.0, [1, 2, 9], 1.0, 1.0, now=5.0) == pytest.approx(0.7)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        andes_qoe(0.0, [1.0], 1.0, 0.0)
    with pytest.raises(ValueError):
        andes_qoe(0.0, [2.0, 1.0], 1.0, 1.0)


def _reference(arrival: float, d: list[float], t0: float, s: float) -> float:
    """The recurrence as written in the paper, token by token."""
    a: list[float] = []
    for i, di in enumerate(d):
        a.append(max(di, arrival + t0) if i == 0 else max(di, a[-1] + 1 / s))
    ideal = [arrival + t0 + i / s for i in range(len(d))]
    whole = sum(a[-1] - t for t in ideal)
    return 1.0 if whole == 0 else 1 - sum(x - t for x, t in zip(a, ideal, strict=True)) / whole


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 5), min_size=1, max_size=40),
    t0=st.floats(0, 3),
    s=st.floats(0.5, 20),
    now=st.none() | st.floats(0, 60),
)
def test_qoe_is_in_unit_interval_and_matches_the_recurrence(
    gaps: list[float], t0: float, s: float, now: float | None
) -> None:
    d = list(np.cumsum(gaps))
    q = andes_qoe(0.0, d, t0, s, now=now)
    assert 0.0 <= q <= 1.0
    if now is None:
        assert q == pytest.approx(_reference(0.0, d, t0, s), abs=1e-9)


def test_in_flight_scoring_never_charges_tokens_beyond_the_output_length() -> None:
    # 3-token request, first token on time, aborted 10 s later at 4.8 tokens/s
    capped = andes_qoe(0.0, [1.0], 1.0, 4.8, now=11.0, total_tokens=3)
    uncapped = andes_qoe(0.0, [1.0], 1.0, 4.8, now=11.0)
    assert uncapped < capped
    # capped: A = 1, 11, 11; T = 1, 1.208, 1.417
    t = [1.0, 1.0 + 1 / 4.8, 1.0 + 2 / 4.8]
    a = [1.0, 11.0, 11.0]
    expect = 1 - sum(x - y for x, y in zip(a, t, strict=True)) / sum(11.0 - y for y in t)
    assert capped == pytest.approx(expect)


def _reference_in_flight(arrival: float, d: list[float], t0: float, s: float, now: float) -> float:
    """The issue's in-flight rule, token by token."""
    d = [x for x in d if x <= now]
    t1 = arrival + t0
    a: list[float] = []
    for i, di in enumerate(d):
        a.append(max(di, t1) if i == 0 else max(di, a[-1] + 1 / s))
    n = len(d)
    if now >= t1:
        expected = int((now - t1) * s + 1e-9) + 1
        for _ in range(n, expected):
            a.append(max(now, a[n - 1]) if n else now)
    if not a:
        return 1.0
    ideal = [t1 + i / s for i in range(len(a))]
    whole = sum(a[-1] - t for t in ideal)
    return 1.0 if whole <= 0 else 1 - sum(x - t for x, t in zip(a, ideal, strict=True)) / whole


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 5), min_size=0, max_size=30),
    t0=st.floats(0, 3),
    s=st.floats(0.5, 20),
    now=st.floats(0, 60),
)
def test_in_flight_qoe_matches_the_rule_token_by_token(gaps: list[float], t0: float, s: float, now: float) -> None:
    d = list(np.cumsum(gaps)) if gaps else []
    assert andes_qoe(0.0, d, t0, s, now=now) == pytest.approx(_reference_in_flight(0.0, d, t0, s, now), abs=1e-9)
