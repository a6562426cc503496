"""A run's JSON summary from its request columns, with numpy alone.

:func:`summarize_columns` reads the columns of :func:`~sloserve.metrics.summary.request_table`
as a mapping of name -> sequence (lists or arrays), so a run that writes no table (a
``simulate --json``) never builds a pandas DataFrame, nor imports pandas;
:func:`~sloserve.metrics.summary.summarize` hands a DataFrame's columns to it. The numbers are
pandas' own for the same table: NaN dropped before each statistic, means as numpy's
pairwise sum over the kept values divided by their count (what pandas does without
bottleneck), quantiles as ``np.percentile`` (linear) computes them (:func:`percentile`),
groups in sorted key order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

_PCTS = (50, 90, 99)

Columns = Mapping[str, Sequence[Any] | NDArray[Any]]
"""Column name -> one value per request (the request table's columns)."""


def _floats(cols: Columns, name: str) -> NDArray[np.float64]:
    return np.asarray(cols[name], dtype=np.float64)


def _mean(v: NDArray[np.float64]) -> float | None:
    """Mean of the non-NaN values (pandas' ``Series.dropna().mean()``), None when none."""
    v = v[~np.isnan(v)]
    return float(v.sum() / v.size) if v.size else None


def percentile(sorted_v: NDArray[np.float64], p: float) -> float:
    """``np.percentile(v, p)`` (its default ``linear`` method) of the NaN-free values
    ``sorted_v`` in ascending order, computed as numpy computes it: the virtual index
    ``(n - 1) · p / 100``, its floor ``i`` and ``t = index − i``, then numpy's ``_lerp``
    between ``v[i]`` and ``v[i + 1]`` (``a + (b − a)·t``, or ``b − (b − a)·(1 − t)`` when
    ``t ≥ 0.5``); an index at or past the last value interpolates the last value with
    itself, as numpy does (an infinite one gives NaN there, as in numpy). The same floats
    (``tests/test_run_summary_percentile.py``), without what ``np.percentile`` costs a
    ``--json`` run: its ``np.unique`` imports ``numpy.ma`` (~11 ms of CPU at start-up).

    float64 values only (every caller's ``_floats``): integers above 2**53 would be rounded
    where numpy keeps them exact. An empty array is a ValueError, not numpy's NaN."""
    n = sorted_v.size
    if not n:
        raise ValueError("percentile of no values")
    vi = (n - 1) * (p / 100)
    if vi >= n - 1:  # numpy's indexes -1 and -1: the last value, t = vi + 1
        i = -1
        a = b = float(sorted_v[-1])
    else:
        i = math.floor(vi)
        a, b = float(sorted_v[i]), float(sorted_v[i + 1])
    t = vi - i
    d = b - a
    return b - d * (1 - t) if t >= 0.5 else a + d * t


def _stats(prefix: str, v: NDArray[np.float64], out: dict[str, Any]) -> None:
    v = v[~np.isnan(v)]
    out[f"{prefix}_mean"] = float(v.mean()) if v.size else None
    s = np.sort(v)
    for p in _PCTS:
        out[f"{prefix}_p{p}"] = percentile(s, p) if v.size else None


def rates_by(
    keys: Sequence[Any] | NDArray[Any], values: NDArray[np.float64]
) -> dict[str, float | None]:
    """:func:`_mean` of ``values`` per key, keys as strings in sorted order (pandas'
    ``groupby(key, sort=True)``, which drops a missing key: None or NaN)."""
    # Each distinct key as it first occurs (dict.fromkeys keeps that one, as setdefault did).
    found = [k for k in dict.fromkeys(keys) if not (k is None or k != k)]  # None, NaN: none
    if len(found) <= _FEW_KEYS:  # (a run's classes) one comparison in C per key and row
        arr = np.fromiter(keys, dtype=object, count=len(keys))
        return {str(k): _mean(values[np.flatnonzero(arr == k)]) for k in sorted(found)}
    codes: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        if k is None or k != k:  # None or NaN (NaN != NaN): no group, as in pandas
            continue
        codes.setdefault(k, []).append(i)
    return {str(k): _mean(values[np.asarray(codes[k], dtype=np.int64)]) for k in sorted(codes)}


_FEW_KEYS = 5
"""Up to this many keys :func:`rates_by` compares each with every row (vectorised);
more, it collects each key's rows in one pass (measured on 16,384 rows: the vectorised
path is faster up to about 6 keys, 1.8 ms each way at 6, slower at 8: 2.2 vs 1.9 ms)."""


def summarize_columns(
    cols: Columns,
    *,
    simulated_seconds: float,
    wall_seconds: float,
    policy: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-serialisable summary of a run (documented in the README)."""
    status = np.asarray(cols["status"], dtype=object)
    n = status.size
    done = status == "finished"
    n_done = int(np.count_nonzero(done))
    out: dict[str, Any] = {
        "policy": policy,
        "requests": n,
        "finished": n_done,
        "rejected": int(np.count_nonzero(status == "rejected")),
        "aborted": int(np.count_nonzero(status == "aborted")),
    }
    for col, name in (
        ("ttft_s", "ttft"),
        ("tpot_s", "tpot"),
        ("e2e_s", "e2e"),
        ("normalized_latency_s", "normalized_latency"),
        ("max_gap_s", "max_gap"),
        ("queue_s", "queue"),
    ):
        _stats(name, _floats(cols, col)[done], out)
    q = _floats(cols, "qoe")
    q = q[~np.isnan(q)]
    out["qoe_mean"] = float(q.sum() / q.size) if q.size else None
    out["qoe_p10"] = percentile(np.sort(q), 10) if q.size else None
    perfect = np.count_nonzero(q >= 1.0 - 1e-9)
    out["qoe_perfect_fraction"] = float(perfect / q.size) if q.size else None
    slo_ok = _floats(cols, "slo_ok")
    out["slo_attainment"] = _mean(slo_ok)
    out["ttft_attainment"] = _mean(_floats(cols, "ttft_ok"))
    out["tpot_attainment"] = _mean(_floats(cols, "tpot_ok"))
    out["deadline_attainment"] = _mean(_floats(cols, "deadline_ok"))
    out["slo_attainment_by_class"] = rates_by(cols["class"], slo_ok) if n else {}
    span = simulated_seconds if simulated_seconds > 0 else float("nan")
    # Integer sums as numpy integers, divided as pandas divides them (int64 / float).
    generated = np.asarray(cols["generated_tokens"], dtype=np.int64)[done].sum()
    out["throughput_tokens_per_s"] = float(generated / span) if span == span else None
    out["throughput_requests_per_s"] = float(n_done / span) if span == span else None
    good = int(np.count_nonzero(done & ((slo_ok == 1.0) | np.isnan(slo_ok))))
    out["goodput_requests_per_s"] = float(good / span) if span == span else None
    out["preemptions"] = int(np.asarray(cols["preemptions"], dtype=np.int64).sum())
    out["swaps"] = int(np.asarray(cols["swaps"], dtype=np.int64).sum())
    out["simulated_seconds"] = simulated_seconds
    out["wall_seconds"] = wall_seconds
    if extra:
        out.update(extra)
    return out
