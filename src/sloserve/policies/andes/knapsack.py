"""Andes' knapsack (Andes §4.1, Equation 5; Algorithms 1 and 2, appendix C) and its solvers.
Paper: ``/work/shared/papers/andes.txt``; the policy that uses them:
:mod:`sloserve.policies.andes.scheduler`. They live with the policy (not in ``optimal/``)
because the policy calls them every decision, and policies sit below ``optimal/``.

Each live request ``i`` is an item with a *gain* ``q[i]`` (its QoE gain if served for the
next Δt at batch size B) and a *weight* ``w[i]`` (the KV it occupies, in blocks). Choose at
most ``B`` items of total weight ``<= M`` maximising the total gain.

* :func:`greedy_pack` — Andes Algorithm 1: sort by priority ``q / l`` (``l`` the context
  length, by default the weight) and take items in that order until one does not fit in
  ``M`` or ``B`` items are taken (the paper *breaks* at the first item that does not fit).
  ``O(N log N)``.
* :func:`dp_pack` — Andes Algorithm 2 (appendix C): the 3D dynamic program over
  (items, batch size, memory). ``O(N·B·M)`` time; the choice table is ``N·(B+1)·(M+1)``
  booleans, so ``M`` must be small (the policy quantises memory, see ``units``).
* :func:`brute_force_pack` — every subset, for tests on tiny instances.

Cardinality: Algorithm 2 reads the optimum at exactly ``B`` items (``dp[N][B][:]``) and the
paper solves Equation 5 for every B. Here ``exact_count=False`` (the default) reads the best
over ``b <= B`` instead, which is the same as taking the best of the exact problems for all
``b <= B``; with non-negative gains it can only be better, and it is always feasible.
``exact_count=True`` is the literal Algorithm 2 (infeasible -> empty solution, value -inf).

All solvers return a :class:`KnapsackSolution` whose ``selected`` is a boolean mask.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class KnapsackSolution:
    """A chosen set of items."""

    selected: BoolArray
    """Mask over the items: True = served."""
    value: float
    """Σ gains of the selected items (``-inf`` when an exact-count problem is infeasible)."""
    weight: int
    """Σ weights of the selected items."""
    order: IntArray | None = None
    """The priority order the greedy solver walked (None for the exact solvers)."""

    @property
    def count(self) -> int:
        return int(self.selected.sum())


def _validate(
    gains: ArrayLike, weights: ArrayLike, capacity: int, max_items: int
) -> tuple[FloatArray, IntArray]:
    q = np.asarray(gains, dtype=np.float64)
    w = np.asarray(weights, dtype=np.int64)
    if q.ndim != 1 or q.shape != w.shape:
        raise ValueError(f"gains and weights must be 1-D of one length ({q.shape} vs {w.shape})")
    if w.size and int(w.min()) < 0:
        raise ValueError("weights must be >= 0")
    if capacity < 0 or max_items < 0:
        raise ValueError("capacity and max_items must be >= 0")
    if not np.all(np.isfinite(q)):
        raise ValueError("gains must be finite")
    return q, w


def greedy_order(
    gains: FloatArray, lengths: FloatArray, tie_order: IntArray | None = None
) -> IntArray:
    """Items in descending priority ``gain / length``; ties keep ``tie_order`` (a
    permutation of the items, most preferred first; default: index order)."""
    prio = gains / np.maximum(lengths, 1e-12)
    if tie_order is None:
        return np.argsort(-prio, kind="stable").astype(np.int64)
    return tie_order[np.argsort(-prio[tie_order], kind="stable")].astype(np.int64)


def greedy_pack(
    gains: ArrayLike,
    weights: ArrayLike,
    capacity: int,
    max_items: int,
    *,
    lengths: ArrayLike | None = None,
    tie_order: IntArray | None = None,
) -> KnapsackSolution:
    """Andes Algorithm 1: priority-ordered packing that stops at the first misfit.

    ``lengths`` is the context length ``l`` the priority divides by (default: the
    weights); ``tie_order`` breaks priority ties (default: index order).
    """
    q, w = _validate(gains, weights, capacity, max_items)
    n = q.size
    lens = w.astype(np.float64) if lengths is None else np.asarray(lengths, dtype=np.float64)
    order = greedy_order(q, lens, tie_order)
    # Prefix of the order that fits: the first item that does not fit ends the packing.
    k = int(np.searchsorted(np.cumsum(w[order]), capacity, side="right")) if n else 0
    k = min(k, max_items)
    sel = np.zeros(n, dtype=np.bool_)
    chosen = order[:k]
    sel[chosen] = True
    return KnapsackSolution(sel, float(q[chosen].sum()), int(w[chosen].sum()), order)


def dp_pack(
    gains: ArrayLike,
    weights: ArrayLike,
    capacity: int,
    max_items: int,
    *,
    exact_count: bool = False,
) -> KnapsackSolution:
    """Andes Algorithm 2: ``dp[i][b][m]`` = best gain of ``b`` items among the first ``i``
    with total weight exactly ``m``; the choice table reconstructs the set.

    Vectorised over (b, m): one numpy update per item.
    """
    q, w = _validate(gains, weights, capacity, max_items)
    n = q.size
    bmax = min(max_items, n)
    m_cap = int(capacity)
    if n and (n * (bmax + 1) * (m_cap + 1)) > 400_000_000:
        raise ValueError(
            f"dp_pack: {n} items × {bmax + 1} × {m_cap + 1} states is too large; "
            "quantise the weights (fewer memory units)"
        )
    neg = -math.inf
    dp = np.full((bmax + 1, m_cap + 1), neg)
    dp[0, 0] = 0.0
    choice = np.zeros((n, bmax + 1, m_cap + 1), dtype=np.bool_)
    for i in range(n):
        wi = int(w[i])
        if wi > m_cap or bmax == 0:
            continue
        hi = min(i + 1, bmax)  # at most i+1 items among the first i+1
        cand = dp[0:hi, 0 : m_cap + 1 - wi] + q[i]
        cur = dp[1 : hi + 1, wi:]
        better = cand > cur
        if better.any():
            choice[i, 1 : hi + 1, wi:] = better
            np.copyto(cur, cand, where=better)
    if exact_count:
        row = dp[bmax] if bmax == max_items else np.full(m_cap + 1, neg)
        b_best = bmax
        m_best = int(np.argmax(row))
        best = float(row[m_best])
    else:
        flat = int(np.argmax(dp))
        b_best, m_best = divmod(flat, m_cap + 1)
        best = float(dp[b_best, m_best])
    sel = np.zeros(n, dtype=np.bool_)
    if best == neg:
        return KnapsackSolution(sel, neg, 0)
    b, m = b_best, m_best
    for i in range(n - 1, -1, -1):
        if b > 0 and choice[i, b, m]:
            sel[i] = True
            m -= int(w[i])
            b -= 1
    return KnapsackSolution(sel, float(q[sel].sum()), int(w[sel].sum()))


def brute_force_pack(
    gains: ArrayLike,
    weights: ArrayLike,
    capacity: int,
    max_items: int,
    *,
    exact_count: bool = False,
) -> KnapsackSolution:
    """Every subset (``exact_count``: of exactly ``max_items`` items); for tests, N <= 16."""
    q, w = _validate(gains, weights, capacity, max_items)
    n = q.size
    if n > 16:
        raise ValueError("brute_force_pack is for tiny instances (<= 16 items)")
    best_val = -math.inf
    best: tuple[int, ...] | None = None
    sizes = [max_items] if exact_count else range(min(max_items, n) + 1)
    for b in sizes:
        if b > n:
            continue
        for combo in itertools.combinations(range(n), b):
            idx = list(combo)
            if int(w[idx].sum()) > capacity:
                continue
            v = float(q[idx].sum())
            if v > best_val + 1e-12:
                best_val, best = v, combo
    sel = np.zeros(n, dtype=np.bool_)
    if best is None:
        return KnapsackSolution(sel, -math.inf, 0)
    sel[list(best)] = True
    return KnapsackSolution(sel, float(q[sel].sum()), int(w[sel].sum()))


def quantize_weights(weights: ArrayLike, capacity: int, units: int) -> tuple[IntArray, int]:
    """Scale a problem to at most ``units`` memory units for the DP: weights are rounded
    *up* and the capacity *down*, so every solution of the scaled problem is feasible in
    the original one (the price is optimality, not feasibility)."""
    w = np.asarray(weights, dtype=np.int64)
    if units < 1:
        raise ValueError("units must be >= 1")
    if capacity <= units:
        return w, int(capacity)
    scale = capacity / units
    return np.ceil(w / scale - 1e-9).astype(np.int64), units
