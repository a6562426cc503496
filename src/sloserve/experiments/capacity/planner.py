"""The capacity planner's two questions, as functions of plain inputs:

* :func:`fewest_gpus` — for each rate and each arm of the space (profile × router ×
  policy × layout), the fewest replicas (and so GPUs: replicas × TP) whose simulated
  traffic meets the SLO targets at the attainment target, on every seed;
* :func:`highest_rate` — for a fixed cluster (each router × policy given), the highest
  arrival rate it sustains.

Both run their searches (:mod:`.search`) together, in rounds on the project's one executor
(local processes or Ray: the same code and the same answers), and return a
:class:`CapacityResult` whose tables hold the answers, every simulation run, and the
monotonicity checks. The rate search of one arm starts from the answer at the rate below
(a start only: the bracket is verified like any other).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.experiments.capacity.probe import Probe, ProbeResult, run_probe
from sloserve.experiments.capacity.search import (
    FewestSearch,
    HighestRateSearch,
    Search,
    run_searches,
)
from sloserve.experiments.capacity.slo import Target
from sloserve.experiments.capacity.space import MAX_REPLICAS, Arm, native_rate
from sloserve.experiments.executor import Executor, as_executor


@dataclass
class CapacityResult:
    """What the planner found (tables, one row per answer / per simulation)."""

    question: str
    """``fewest-gpus`` or ``max-rate``."""
    answers: pd.DataFrame
    """One row per arm (and rate): the answer, its neighbour, attainment over seeds, cost,
    the monotonicity check and the explanation columns (``explain_*``)."""
    probes: pd.DataFrame
    """Every simulation: arm, replicas, rate, seed, passes, attainment, stopped_at_s..."""
    checks: list[str] = field(default_factory=list)
    """Monotonicity violations found (empty: none), one sentence each."""
    rounds: int = 0
    simulations: int = 0
    wall_s: float = 0.0
    configurations: int = 0
    """Size of the searched space: arms × rates × replica counts (or × rate bracket)."""
    settings: dict[str, Any] = field(default_factory=dict)


def _row(r: ProbeResult) -> dict[str, Any]:
    a = r.arm
    return {
        "profile": a.profile,
        "router": a.router,
        "policy": a.policy,
        "layout": str(a.layout),
        "replicas": r.replicas,
        "gpus": r.gpus,
        "rate": r.rate,
        "seed": r.seed,
        "passes": r.passes,
        "attainment": r.attainment,
        "stopped_at_s": r.stopped_at_s,
        "requests": r.requests,
        "realised_rate": r.realised_rate,
        "gpu_seconds": r.gpu_seconds,
        "cost_usd": r.cost_usd,
        "cost_per_mtok": r.cost_per_mtok,
        "wall_s": r.wall_s,
    }


def _prices(profiles: Sequence[str], prices: Mapping[str, float] | None) -> dict[str, float | None]:
    """Each profile's GPU-hour price: ``prices`` first, else the profile's own field."""
    from sloserve.costmodel.profile import load_profile

    out: dict[str, float | None] = {}
    for arm_profile in profiles:
        for p in arm_profile.split("+"):
            if p in out:
                continue
            try:
                prof = load_profile(p)
            except ConfigError as e:
                raise ConfigError(f"--profiles: {e}") from None
            out[p] = (prices or {}).get(p, prof.gpu_hour_usd)
    unknown = sorted(set(prices or {}) - set(out))
    if unknown:
        raise ConfigError(f"--gpu-price: {unknown[0]!r} is not one of the searched profiles")
    return out


class _Collector:
    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.results: list[ProbeResult] = []
        self.progress = progress

    def __call__(self, s: Search, x: float, seed: int, res: ProbeResult) -> None:
        self.results.append(res)
        if self.progress is not None:
            verdict = "pass" if res.passes else "miss"
            stop = f" (stopped at {res.stopped_at_s:g} s)" if res.stopped_at_s else ""
            self.progress(
                f"{res.arm.label} | {res.replicas} replicas @ {res.rate:g}/s seed {seed}: "
                f"{verdict} {res.attainment:.3f}{stop}"
            )


def _lookup(results: Sequence[ProbeResult], arm: Arm, rate: float, n: int) -> list[ProbeResult]:
    return [r for r in results if r.arm == arm and r.rate == rate and r.replicas == n]


def _explain_cols(prefix: str, probes: Sequence[ProbeResult]) -> dict[str, Any]:
    """The explanation of the worst seed (the one that decides the verdict)."""
    if not probes:
        return {}
    worst = min(probes, key=lambda r: (r.passes, r.attainment))
    e = worst.explain
    return {
        f"{prefix}_missed": e.get("missed"),
        f"{prefix}_missed_by": ",".join(f"{k}:{v}" for k, v in e.get("missed_by", {}).items()),
        f"{prefix}_queue_share": e.get("ttft_queue_share"),
        f"{prefix}_prefill_share": e.get("ttft_prefill_share"),
        f"{prefix}_missed_tpot_s": e.get("missed_tpot_mean_s"),
        f"{prefix}_kv_usage": e.get("kv_usage_mean"),
        f"{prefix}_preemptions": e.get("preemptions"),
        f"{prefix}_rejected": e.get("rejected"),
        f"{prefix}_stopped_at_s": worst.stopped_at_s,
    }


def _summary(probes: Sequence[ProbeResult], prices: Mapping[str, float | None]) -> dict[str, Any]:
    """Attainment over seeds (min, spread), cost and limits of one answer's probes."""
    atts = [r.attainment for r in probes]
    first = probes[0]
    hourly = None
    if all(prices.get(p) is not None for p in first.arm.profiles):
        from sloserve.costmodel.profile import load_profile
        from sloserve.experiments.capacity.space import groups

        hourly = sum(
            g["count"] * load_profile(g["profile"]).tp * (prices[g["profile"]] or 0.0)
            for g in groups(first.arm, first.replicas, prices)
        )
    # The steady-state cost of serving the rate: the cluster's price per hour over the
    # output tokens it serves per hour (not the simulated run's, whose drain tail after
    # the last arrival would count idle GPUs).
    per_s = [
        r.output_tokens * r.realised_rate / r.requests
        for r in probes
        if r.stopped_at_s is None and r.requests
    ]
    mtok = None
    if hourly is not None and per_s and sum(per_s) > 0:
        mtok = hourly / (sum(per_s) / len(per_s) * 3600) * 1e6
    return {
        "attainment": min(atts),
        "attainment_spread": max(atts) - min(atts),
        "seeds": len(probes),
        "usd_per_hour": hourly,
        "cost_per_mtok": mtok,
        "realised_rate": sum(r.realised_rate for r in probes) / len(probes),
    }


def _hint(x: float, r: ProbeResult) -> float | None:
    """A saturated failing run's throughput bound on the replicas needed (a clear
    shortfall only: below 1.2 the run kept up, and the SLO, not throughput, decided)."""
    return x * r.load_ratio if r.load_ratio > 1.2 else None


SCREEN_FRACTION = 0.25
"""Default share of the window a screening search runs on."""
SCREEN_MIN_S = 240.0
"""Windows shorter than this are searched directly (a quarter of them says too little)."""


def screen_window(base: Mapping[str, Any], fraction: float | None) -> dict[str, Any] | None:
    """``base`` cut to the first ``fraction`` of its ``duration_s`` for a screening search
    (None: no screening — no fraction, a window under :data:`SCREEN_MIN_S`, a workload
    bounded by a request count or driven by closed-loop batch jobs)."""
    if not fraction:
        return None
    if not 0 < fraction < 1:
        raise ConfigError(f"--screen: {fraction:g} outside (0, 1)")
    wl = base.get("workload") or {}
    duration = wl.get("duration_s")
    if duration is None or float(duration) < SCREEN_MIN_S:
        return None
    if wl.get("num_requests") is not None or wl.get("batch_jobs"):
        return None
    out: dict[str, Any] = json.loads(json.dumps(dict(base)))
    out["workload"]["duration_s"] = float(duration) * fraction
    return out


def _start(searches: Mapping[tuple[Arm, float], FewestSearch], arm: Arm, rate: float) -> int:
    """Where a search starts: the arm's answer at the highest lower rate, else its minimum."""
    prev = [s.answer for (a, r), s in searches.items() if a == arm and r < rate]
    return max([x for x in prev if x is not None] or [arm.layout.min_replicas])


def fewest_gpus(
    base: Mapping[str, Any],
    arms: Sequence[Arm],
    rates: Sequence[float],
    targets: Sequence[Target],
    attainment: float,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    max_replicas: int = 32,
    prices: Mapping[str, float] | None = None,
    router_params: Mapping[str, Mapping[str, Any]] | None = None,
    early_stop: bool = True,
    screen: float | None = SCREEN_FRACTION,
    executor: Executor | str | None = None,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> CapacityResult:
    """For each rate and arm, the fewest replicas meeting the targets on every seed.

    ``screen``: first search on that fraction of the window (its first part: the same
    arrivals, one seed), then start the full-window search at the screening answer (None
    or 0: no screening; see :func:`screen_window`). Only full-window runs decide."""
    if not arms:
        raise ConfigError("the search space is empty (no profile, router or policy)")
    if not 1 <= max_replicas <= MAX_REPLICAS:
        raise ConfigError(f"--max-replicas: {max_replicas} outside [1, {MAX_REPLICAS}]")
    if not seeds:
        raise ConfigError("--seeds: give at least one seed")
    t0 = time.perf_counter()
    price = _prices([a.profile for a in arms], prices)
    native = native_rate(base)
    rps = router_params or {}
    col = _Collector(progress)
    screened = _Collector(progress)
    window = screen_window(base, screen)
    ex, owned = as_executor(executor, workers)
    rounds = 0
    searches: dict[tuple[Arm, float], FewestSearch] = {}

    def make_task(run_base: Mapping[str, Any]) -> Callable[[Search, float, int], Probe]:
        def task(s: Search, x: float, seed: int) -> Probe:
            t_arm, t_rate = cast(tuple[Arm, float], s.key)
            return Probe(
                dict(run_base),
                t_arm,
                int(x),
                t_rate,
                seed,
                tuple(targets),
                attainment,
                native,
                tuple(sorted(price.items())),
                tuple(sorted(rps.get(t_arm.router, {}).items())),
                early_stop,
            )

        return task

    try:
        # Rates in increasing order, every arm of a rate at once: the answer at one rate
        # is where the next rate's bracket starts.
        for rate in sorted(rates):
            guesses: dict[Arm, int | None] = {}
            if window is not None:
                first = [
                    FewestSearch(
                        (arm, rate),
                        arm.layout.min_replicas,
                        max_replicas,
                        _start(searches, arm, rate),
                    )
                    for arm in arms
                ]
                rounds += run_searches(
                    first,
                    make_task(window),
                    run_probe,
                    lambda r: bool(r.passes),
                    ex,
                    seeds=seeds[:1],
                    on_result=screened,
                    hint=_hint,
                )
                guesses = {arm: f.answer for arm, f in zip(arms, first, strict=True)}
            batch = []
            for arm in arms:
                s = FewestSearch(
                    (arm, rate),
                    arm.layout.min_replicas,
                    max_replicas,
                    _start(searches, arm, rate),
                    guess=guesses.get(arm),
                )
                searches[(arm, rate)] = s
                batch.append(s)
            rounds += run_searches(
                batch,
                make_task(base),
                run_probe,
                lambda r: bool(r.passes),
                ex,
                seeds=seeds,
                on_result=col,
                hint=_hint,
            )
    finally:
        if owned:
            ex.close()
    rows, checks = [], []
    for (arm, rate), s in searches.items():
        ans, below = s.answer, s.neighbour
        row: dict[str, Any] = {
            "profile": arm.profile,
            "router": arm.router,
            "policy": arm.policy,
            "layout": str(arm.layout),
            "rate": rate,
            "replicas": ans,
            "gpus": None,
            "neighbour_replicas": below,
            "neighbour_attainment": None,
            "monotone": True,
            "violations": "",
        }
        at = _lookup(col.results, arm, rate, ans) if ans is not None else []
        nb = _lookup(col.results, arm, rate, below) if below is not None else []
        if at:
            row["gpus"] = at[0].gpus
            row.update(_summary(at, price))
        else:
            row["attainment"] = None
        if nb:
            row["neighbour_attainment"] = min(r.attainment for r in nb)
        v = s.violations()
        if v:
            row["monotone"] = False
            row["violations"] = "; ".join(str(x) for x in v)
            checks.append(
                f"{arm.label} @ {rate:g}/s: attainment is not monotone in replicas "
                f"({row['violations']}); the minimum {ans} may not be the true one"
            )
        row.update(_explain_cols("explain_min", at))
        row.update(_explain_cols("explain_below", nb))
        rows.append(row)
    answers = pd.DataFrame(rows)
    checks += _rate_checks(answers)
    return CapacityResult(
        "fewest-gpus",
        answers,
        pd.DataFrame(
            [{**_row(r), "screen": True} for r in screened.results]
            + [{**_row(r), "screen": False} for r in col.results]
        ),
        checks,
        rounds,
        len(col.results) + len(screened.results),
        time.perf_counter() - t0,
        configurations=len(rates) * sum(max_replicas - a.layout.min_replicas + 1 for a in arms),
        settings={
            "native_rate": native,
            "seeds": list(seeds),
            "prices": price,
            "screen_window_s": None if window is None else window["workload"]["duration_s"],
        },
    )


def _rate_checks(answers: pd.DataFrame) -> list[str]:
    """GPUs needed should not fall as the rate grows: a fall is reported."""
    out: list[str] = []
    if not len(answers):
        return out
    for key, g in answers.groupby(["profile", "router", "policy", "layout"], sort=False):
        g = g.sort_values("rate")
        prev = None
        for rate, n in zip(g["rate"], g["replicas"], strict=True):
            if n is None or pd.isna(n):
                prev = None
                continue
            if prev is not None and n < prev[1]:
                out.append(
                    f"{' | '.join(map(str, key))}: {int(n)} replicas meet {rate:g}/s but "
                    f"{int(prev[1])} were needed at {prev[0]:g}/s (not monotone in rate)"
                )
            prev = (rate, n)
    return out


def _cluster_label(base: Mapping[str, Any], cluster: Mapping[str, Any]) -> str:
    """``2×llama-2-7b-a100+1×...``: the fixed cluster's groups."""
    default = (base.get("instance") or {}).get("profile", "llama-2-7b-a100")
    parts = []
    for g in cluster.get("replicas") or [{}]:
        role = g.get("role", "both")
        parts.append(
            f"{g.get('count', 1)}×{g.get('profile') or default}"
            + ("" if role == "both" else f"({role})")
        )
    return "+".join(parts)


def highest_rate(
    base: Mapping[str, Any],
    cluster: Mapping[str, Any],
    routers: Sequence[str],
    policies: Sequence[str],
    targets: Sequence[Target],
    attainment: float,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    low: float = 0.05,
    high: float = 1e4,
    start: float | None = None,
    tolerance: float = 0.05,
    early_stop: bool = True,
    executor: Executor | str | None = None,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> CapacityResult:
    """For the fixed ``cluster`` (a ``cluster:`` mapping) under each router × policy, the
    highest rate meeting the targets on every seed (to ``tolerance``)."""
    if not routers or not policies:
        raise ConfigError("the search space is empty (no router or policy)")
    if not 0 < tolerance < 1:
        raise ConfigError(f"--tolerance: {tolerance} outside (0, 1)")
    t0 = time.perf_counter()
    native = native_rate(base)
    wl = base.get("workload", {})
    if start is None:
        arr = wl.get("arrival", {}) if isinstance(wl, Mapping) else {}
        start = float(arr.get("rate", 4.0)) if native is None else native
    col = _Collector(progress)
    searches = [
        HighestRateSearch((r, p), low, high, min(max(start, low), high), tolerance)
        for r in routers
        for p in policies
    ]

    label = _cluster_label(base, cluster)

    def task(s: Search, x: float, seed: int) -> Probe:
        t_router, t_policy = cast(tuple[str, str], s.key)
        return Probe(
            dict(base),
            Arm(label, t_router, t_policy),
            0,
            x,
            seed,
            tuple(targets),
            attainment,
            native,
            early_stop=early_stop,
            cluster=dict(cluster),
        )

    ex, owned = as_executor(executor, workers)
    try:
        rounds = run_searches(
            searches, task, run_probe, lambda r: bool(r.passes), ex, seeds=seeds, on_result=col
        )
    finally:
        if owned:
            ex.close()
    rows, checks = [], []
    for s in searches:
        router, policy = cast(tuple[str, str], s.key)
        ans, above = s.answer, s.neighbour
        at = [
            r
            for r in col.results
            if r.arm.router == router and r.arm.policy == policy and r.rate == ans
        ]
        nb = [
            r
            for r in col.results
            if r.arm.router == router and r.arm.policy == policy and r.rate == above
        ]
        row: dict[str, Any] = {
            "router": router,
            "policy": policy,
            "max_rate": ans,
            "failing_rate": above,
            "gpus": (at or nb)[0].gpus if (at or nb) else None,
            "attainment": min(r.attainment for r in at) if at else None,
            "attainment_spread": (
                max(r.attainment for r in at) - min(r.attainment for r in at) if at else None
            ),
            "failing_attainment": min(r.attainment for r in nb) if nb else None,
            "monotone": not s.violations(),
            "violations": "; ".join(str(v) for v in s.violations()),
        }
        row.update(_explain_cols("explain_max", at))
        row.update(_explain_cols("explain_above", nb))
        if s.violations():
            checks.append(
                f"{router} | {policy}: attainment is not monotone in rate "
                f"({row['violations']}); the highest rate may not be the true one"
            )
        rows.append(row)
    return CapacityResult(
        "max-rate",
        pd.DataFrame(rows),
        pd.DataFrame([{**_row(r), "screen": False} for r in col.results]),
        checks,
        rounds,
        len(col.results),
        time.perf_counter() - t0,
        configurations=len(searches),
        settings={"native_rate": native, "seeds": list(seeds), "tolerance": tolerance},
    )
