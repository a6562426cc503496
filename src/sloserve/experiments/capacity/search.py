"""Monotone searches in rounds: the fewest replicas that pass (:class:`FewestSearch`), the
highest rate that passes (:class:`HighestRateSearch`), and the driver that runs many of
them at once on the project's one executor (:func:`run_searches`).

**Assumption**: passing is monotone — more replicas never turn a pass into a miss, and a
higher rate never turns a miss into a pass. Simulated attainment is only *nearly*
monotone (a router's rotation, a different split of a mix, a seed's bursts), so the
assumption is checked, never trusted silently:

* every point a search visits is kept; any pair that contradicts monotonicity (a passing
  count above a failing one, a passing rate above a failing one) is a
  :class:`Violation` on the answer, reported with the answer;
* the answer is verified: the minimum passed, and its neighbour one replica below it
  failed (both were simulated: the bracket ends on them); for a rate, the answer passed
  and a rate within the tolerance above it failed.

**Rounds.** Each round, every unfinished search proposes ``k`` points (k-section: ``k``
evenly spaced points inside its bracket; ``k = 1`` is bisection), one task per point and
seed goes to the executor in one :meth:`~sloserve.experiments.executor.Executor.submit_round`,
and a point passes only when every seed passes (conservative). ``k`` is chosen so that a
round fills the executor's workers: ``max(1, workers // (searches × seeds))``.
Bracketing first doubles from a start point (a lower rate's answer is a good start for the
next rate, but only as a start: the bracket is still verified).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sloserve.experiments.executor import Executor


@dataclass(frozen=True)
class Violation:
    """Two visited points that contradict monotonicity: ``passing`` passed and
    ``failing`` failed although monotonicity says the other way round."""

    passing: float
    failing: float

    def __str__(self) -> str:
        return f"{self.passing:g} passed but {self.failing:g} failed"


@dataclass
class FewestSearch:
    """The fewest replicas in ``[low, high]`` that pass (integers; ``None``: none does)."""

    key: Hashable
    low: int = 1
    high: int = 64
    start: int = 1
    visited: dict[int, bool] = field(default_factory=dict)
    hint: int | None = None
    """The largest count a failing run suggested (its load ratio times its count): a
    throughput bound, so the bracket jumps there instead of doubling."""
    guess: int | None = None
    """A likely answer (a screening search's, on a shorter window): the first round
    tries it and the count below it, and while neither passes the bracket grows by
    ``guess_growth`` (the answer is expected near), not by doubling."""
    guess_growth: float = 1.25

    def __post_init__(self) -> None:
        self.start = min(max(self.start, self.low), self.high)

    def _bracket(self) -> tuple[int, int | None]:
        passing = [n for n, ok in self.visited.items() if ok]
        hi = min(passing) if passing else None
        below = [n for n, ok in self.visited.items() if not ok and (hi is None or n < hi)]
        return (max(below) if below else self.low - 1), hi

    @property
    def done(self) -> bool:
        lo, hi = self._bracket()
        if hi is None:
            return lo >= self.high
        return hi - lo <= 1

    def propose(self, k: int) -> list[int]:
        lo, hi = self._bracket()
        g = self.guess
        if g is not None and not self.visited:
            g = min(max(g, self.low), self.high)
            return sorted({max(self.low, g - 1), g})
        if hi is None:  # no pass yet: double upward from the start (or the last miss)
            if self.hint is not None and self.hint > lo + 1:
                # k points from the throughput bound up (the SLO may need headroom)
                pts = [min(self.high, math.ceil(self.hint * 1.3**j)) for j in range(k)]
            elif g is not None and lo >= self.low:
                # the guess missed, not by a throughput shortfall: k points over one small
                # step up (the answer is expected near)
                step = self.guess_growth
                pts = [
                    min(self.high, max(lo + 1 + j, math.floor(lo * step ** ((j + 1) / k))))
                    for j in range(k)
                ]
            else:
                base = max(lo + 1, 2 * lo, self.start)
                pts = [min(self.high, base * 2**j) for j in range(k)]
        else:  # k-section of (lo, hi)
            gap = hi - lo
            pts = [lo + max(1, round(gap * (j + 1) / (k + 1))) for j in range(k)]
            pts = [x for x in pts if lo < x < hi]
        return sorted({x for x in pts if x not in self.visited})

    def record(self, x: float, ok: bool, hint: float | None = None) -> None:
        self.visited[int(x)] = ok
        if not ok and hint is not None and hint > x:
            self.hint = max(self.hint or 0, math.ceil(hint - 1e-9))

    @property
    def answer(self) -> int | None:
        return self._bracket()[1]

    @property
    def neighbour(self) -> int | None:
        """The configuration one step below the answer (simulated, and failed), if any."""
        a = self.answer
        return a - 1 if a is not None and a - 1 in self.visited else None

    def violations(self) -> list[Violation]:
        ok = sorted(n for n, v in self.visited.items() if v)
        bad = sorted(n for n, v in self.visited.items() if not v)
        return [Violation(p, f) for p in ok for f in bad if f > p]


@dataclass
class HighestRateSearch:
    """The highest rate in ``[low, high]`` that passes, to a relative ``tolerance``
    (``None``: not even ``low`` passes)."""

    key: Hashable
    low: float = 0.01
    high: float = 1e4
    start: float = 1.0
    tolerance: float = 0.05
    visited: dict[float, bool] = field(default_factory=dict)

    def _bracket(self) -> tuple[float | None, float | None]:
        fails = [r for r, ok in self.visited.items() if not ok]
        hi = min(fails) if fails else None
        ok = [r for r, v in self.visited.items() if v and (hi is None or r < hi)]
        return (max(ok) if ok else None), hi

    @property
    def done(self) -> bool:
        lo, hi = self._bracket()
        if lo is None:
            return hi is not None and hi <= self.low * (1 + 1e-9)
        if hi is None:
            return lo >= self.high * (1 - 1e-9)
        return hi / lo <= 1 + self.tolerance

    def propose(self, k: int) -> list[float]:
        lo, hi = self._bracket()
        if lo is None and hi is None:
            pts = [self.start * 2**j for j in range(k)]
        elif hi is None:
            assert lo is not None
            pts = [lo * 2 ** (j + 1) for j in range(k)]
        elif lo is None:
            pts = [hi / 2 ** (j + 1) for j in range(k)]
        else:  # geometric k-section of (lo, hi)
            pts = [lo * (hi / lo) ** ((j + 1) / (k + 1)) for j in range(k)]
        pts = [round(min(self.high, max(self.low, x)), 6) for x in pts]
        return sorted({x for x in pts if x not in self.visited})

    def record(self, x: float, ok: bool, hint: float | None = None) -> None:
        self.visited[float(x)] = ok

    @property
    def answer(self) -> float | None:
        return self._bracket()[0]

    @property
    def neighbour(self) -> float | None:
        """The failing rate just above the answer (within the tolerance once done)."""
        return self._bracket()[1]

    def violations(self) -> list[Violation]:
        ok = sorted(r for r, v in self.visited.items() if v)
        bad = sorted(r for r, v in self.visited.items() if not v)
        return [Violation(p, f) for p in ok for f in bad if f < p]


Search = FewestSearch | HighestRateSearch


def run_searches(
    searches: Sequence[Search],
    task: Callable[[Search, float, int], Any],
    fn: Callable[[Any], Any],
    passed: Callable[[Any], bool],
    executor: Executor,
    *,
    seeds: Sequence[int] = (0,),
    k: int | None = None,
    on_result: Callable[[Search, float, int, Any], None] | None = None,
    hint: Callable[[float, Any], float | None] | None = None,
    max_rounds: int = 64,
) -> int:
    """Run ``searches`` to the end in rounds on ``executor``; returns the number of rounds.

    ``task(search, point, seed)`` builds the executor item, ``fn`` runs it (picklable),
    ``passed(result)`` judges it; ``on_result`` sees every result as its round ends (in
    submission order: deterministic whatever the backend); ``hint(point, result)`` may
    suggest where a failing point's search should look next (:class:`FewestSearch`)."""
    rounds = 0
    while rounds < max_rounds:
        active = [s for s in searches if not s.done]
        if not active:
            break
        per = k or max(1, min(8, executor.workers // (len(active) * len(seeds))))
        plan: list[tuple[Search, float, int]] = []
        for s in active:
            for x in s.propose(per):
                plan.extend((s, x, seed) for seed in seeds)
        if not plan:  # nothing left to try inside the bounds
            break
        results = executor.wait(executor.submit_round(fn, [task(s, x, sd) for s, x, sd in plan]))
        verdicts: dict[tuple[int, float], bool] = {}
        hints: dict[tuple[int, float], float] = {}
        for (s, x, sd), res in zip(plan, results, strict=True):
            if on_result is not None:
                on_result(s, x, sd, res)
            kx = (id(s), x)
            verdicts[kx] = verdicts.get(kx, True) and passed(res)
            h = hint(x, res) if hint is not None else None
            if h is not None:
                hints[kx] = max(hints.get(kx, h), h)
        for s, x, _ in plan:
            if (id(s), x) in verdicts:
                s.record(x, verdicts.pop((id(s), x)), hints.get((id(s), x)))
        rounds += 1
    return rounds
