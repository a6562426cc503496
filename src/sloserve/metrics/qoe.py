"""Andes' quality of experience for streamed text (Andes §3.1), exactly as the paper.

The user expects token i at ``T_i = arrival + ttft_target + (i-1)/s`` and cannot read
faster than ``s`` tokens/s, so token i is actually consumed at
``A_1 = max(d_1, T_1)``, ``A_i = max(d_i, A_{i-1} + 1/s)``. With
``S_delay = Σ (A_i − T_i)`` and ``S_whole = Σ (A_n − T_i)``,
``QoE = 1 − S_delay / S_whole`` (1 when ``S_whole`` is 0).

In flight at ``now``: every token the ideal timeline expects by ``now`` (``T_i <= now``)
but not yet delivered counts as consumed at ``max(now, A_k)``, k the last delivered token,
so a request with no token at all scores 0 once ``T_1`` has passed and 1 before.

The recurrence has a closed form used here for speed: with ``x_i = d_i − (i−1)/s``
(``x_1`` raised to ``T_1``), ``A_i = cummax(x)_i + (i−1)/s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray


def consumption_times(
    arrival: float,
    token_times: Sequence[float] | NDArray[np.float64],
    ttft_target: float,
    tokens_per_s: float,
) -> NDArray[np.float64]:
    """When the user actually reads each delivered token (the pacer-limited timeline)."""
    d = np.asarray(token_times, dtype=np.float64)
    if d.size == 0:
        return d
    steps = np.arange(d.size, dtype=np.float64) / tokens_per_s
    x = d - steps
    x[0] = max(x[0], arrival + ttft_target)
    return np.maximum.accumulate(x) + steps


def delivered_qoe(
    arrival: float,
    token_times: NDArray[np.float64],
    ttft_target: float,
    tokens_per_s: float,
) -> float:
    """:func:`andes_qoe` of a request whose every token was delivered, its token times
    non-decreasing (read from an iteration log), with the same arithmetic and result:
    it only skips the in-flight branch and the order check, and shares ``(i-1)/s``
    between the consumption and the ideal timelines."""
    if not tokens_per_s > 0:
        raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
    if not ttft_target >= 0:
        raise ValueError(f"ttft_target must be >= 0, got {ttft_target}")
    n = token_times.size
    if n == 0:
        return 1.0
    st = np.arange(n, dtype=np.float64) / tokens_per_s
    x = token_times - st
    t1 = arrival + ttft_target
    x[0] = max(x[0], t1)
    a = np.maximum.accumulate(x) + st
    ideal = t1 + st
    s_whole = float((a[-1] - ideal).sum())
    if s_whole <= 0:
        return 1.0
    s_delay = float((a - ideal).sum())
    return min(1.0, max(0.0, 1.0 - s_delay / s_whole))


def andes_qoe(
    arrival: float,
    token_times: Sequence[float] | NDArray[np.float64],
    ttft_target: float,
    tokens_per_s: float,
    now: float | None = None,
    total_tokens: int | None = None,
) -> float:
    """QoE in [0, 1] of one request; ``now`` set means the request is still in flight.

    ``total_tokens`` (the request's output length, when known) caps the tokens counted as
    expected-but-undelivered in flight: a request is never charged for tokens it would not
    have produced.
    """
    if not tokens_per_s > 0:
        raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
    if not ttft_target >= 0:
        raise ValueError(f"ttft_target must be >= 0, got {ttft_target}")
    d = np.asarray(token_times, dtype=np.float64)
    if now is not None:
        d = d[d <= now]
    if d.size > 1 and np.any(np.diff(d) < 0):
        raise ValueError("token_times must be non-decreasing")
    t1 = arrival + ttft_target
    a = consumption_times(arrival, d, ttft_target, tokens_per_s)
    n_total = d.size
    if now is not None and now >= t1:
        expected = math.floor((now - t1) * tokens_per_s + 1e-9) + 1
        if total_tokens is not None:
            expected = min(expected, total_tokens)
        if expected > d.size:
            fill = max(now, float(a[-1])) if a.size else now
            a = np.concatenate([a, np.full(expected - d.size, fill)])
            n_total = expected
    if n_total == 0:
        return 1.0
    ideal = t1 + np.arange(n_total, dtype=np.float64) / tokens_per_s
    s_whole = float(np.sum(a[-1] - ideal))
    if s_whole <= 0:
        return 1.0
    s_delay = float(np.sum(a - ideal))
    return min(1.0, max(0.0, 1.0 - s_delay / s_whole))
