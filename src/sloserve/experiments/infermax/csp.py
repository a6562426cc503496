"""InferMax §4.5 (``papers/infermax.txt``), "Are evictions always evil?": the CSP with and
without evictions.

For each input length I: ``num_requests`` identical offline requests (input I, output
``output``), KV capacity ``M = max(2I, I + O - 1)`` tokens (two prompts fit at once, only one
request can keep its KV to its last token), C = P = 4096, token-exact KV. Three schedules:

* the CSP optimum with evictions allowed (hinted with the better of the eviction-free
  optimum and the best preset, so it is never worse than either);
* the best eviction-free schedule: the same CSP with eviction forbidden;
* every Table 1 preset and its eviction-free variant run through the engine.

Latencies are total latencies Σ_i (finish_i − arrival_i) in seconds, priced by the engine's
cost model (the profile's). ``latency_gap_pct = (best_ef − optimal) / best_ef · 100``:
positive when evicting helps. The solver status and gap are always reported: a row whose
status is ``feasible`` is the best schedule found within ``time_limit_s``, not a proven
optimum. Both solves use the same number of batches J: the number that provably cannot
cut off a better schedule (``batches_needed``) when it is at most twice the presets' largest
batch count, else that count. ``batches_sufficient`` says which: when True an ``optimal``
row is a global optimum, else it is optimal among schedules of at most J batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.costmodel.base import CostModel
from sloserve.costmodel.profile import load_profile
from sloserve.engine.interface import Limits
from sloserve.optimal.infermax import (
    Baseline,
    CspOptions,
    CspResult,
    Job,
    Schedule,
    batches_needed,
    evaluate,
    record_policy,
    run_baseline,
    solve,
    uniform_jobs,
)

TABLE1_PRESETS = ("vllm", "sarathi", "sarathi-p=c", "sarathi-nocp", "vllm-hy", "sarathi-nohy")
"""InferMax Table 1; each also runs as its eviction-free variant (``-ef``)."""

PAPER = {
    "evict_below_I": 128,
    "max_gain_pct": 35.2,
    "max_loss_pct_when_evicting_long": 27.5,
}
"""§4.5's numbers: the CSP evicts for I < 128 (up to 35.2% lower latency than eviction-free)
and not for I ≥ 128 (evicting long requests would cost up to 27.5%)."""


def section45_limits(input_tokens: int, output: int, capacity: int = 4096) -> Limits:
    """§4.5's limits for input I: M = max(2I, I + O − 1), C = P = 4096 (token-exact)."""
    m = max(2 * input_tokens, input_tokens + output - 1)
    return Limits(capacity, capacity, m, 256, 1)


def csp_eviction_sweep(
    inputs: Sequence[int],
    *,
    output: int = 4,
    num_requests: int = 4,
    profile: str = "llama-2-7b-a100",
    time_limit_s: float = 10.0,
    seed: int = 0,
    workers: int | None = None,
    deterministic_limit: float | None = None,
    forced_eviction: bool = False,
) -> pd.DataFrame:
    """One row per I: columns I, M, optimal_latency, optimal_evictions, status, gap,
    best_ef_latency, best_ef_status, best_preset, best_preset_latency, latency_gap_pct
    (and a few more: ef_gap, optimal_batches, max_batches, solve_seconds).

    ``time_limit_s`` bounds each of the two solves per I (wall clock); ``workers`` is
    CP-SAT's worker count (None: min(8, CPUs)); ``deterministic_limit`` adds CP-SAT's
    load-independent limit (with ``workers=1`` the rows are then identical on every run).

    ``forced_eviction`` adds the best schedule that evicts at least once (a third solve,
    only where the optimum does not evict): columns ``best_evicting_latency``,
    ``best_evicting_status`` and ``eviction_cost_pct`` = (best_evicting − best_ef) /
    best_evicting · 100, what §4.5 reports as eviction-free schedules' gain for long inputs.
    Each row also carries ``optimal_schedule``, the optimum as text (one ``|``-separated
    batch each: ``r0:64 r1:64``, evictions as ``!r1``).
    """
    if not inputs:
        raise ConfigError("csp_eviction_sweep needs at least one input length")
    if any(i < 1 for i in inputs) or output < 1 or num_requests < 1:
        raise ConfigError("inputs, output and num_requests must be >= 1")
    cost_model = load_profile(profile).cost_model()
    rows = []
    for inp in inputs:
        jobs = uniform_jobs(num_requests, inp, output)
        limits = section45_limits(inp, output)
        presets = [*TABLE1_PRESETS, *(f"{p}-ef" for p in TABLE1_PRESETS)]
        runs = {p: run_baseline(p, jobs, cost_model, limits) for p in presets}
        ok = _cands_of(runs)
        if not ok:
            raise ConfigError(f"I={inp}: no preset could serve the instance")
        best_preset = min(ok, key=lambda p: ok[p][0])
        best_preset_latency = ok[best_preset][0]
        # J: enough batches to prove global optimality when that is at most twice the
        # presets' largest batch count (short inputs); else the presets' count (a larger
        # model searches worse within the limit)
        j0 = max(sched.num_batches for _lat, sched in ok.values())
        need = batches_needed(jobs, best_preset_latency, "latency", cost_model) or j0
        J = need if j0 < need <= 2 * j0 else j0
        base = CspOptions(
            max_batches=J,
            time_limit_s=time_limit_s,
            deterministic_limit=deterministic_limit,
            seed=seed,
            workers=workers,
            warm_start=(),
        )
        # any preset schedule without evictions seeds the eviction-free solve
        ef_hint = _best_schedule([c for c in ok.values() if c[1].evictions == 0])
        ef_opts = dataclasses.replace(base, allow_eviction=False)
        ef = solve(jobs, limits, cost_model, ef_opts, hint=ef_hint)
        # the evicting solve starts from the better of the eviction-free optimum and every
        # preset, so its answer is never worse than either
        cands = list(ok.values())
        if ef.evaluation is not None and ef.schedule is not None:
            cands.append((ef.evaluation.total_latency, ef.schedule))
        hint = _best_schedule(cands)
        opt = solve(jobs, limits, cost_model, base, hint=hint)
        row = _row(inp, limits, opt, ef, best_preset, best_preset_latency, J)
        if forced_eviction:
            row.update(_forced(jobs, limits, cost_model, base, opt, ok, row))
        rows.append(row)
    return pd.DataFrame(rows)


def _cands_of(runs: dict[str, Baseline]) -> dict[str, tuple[float, Schedule]]:
    """(total latency, schedule) of every baseline that served the instance."""
    return {
        p: (b.evaluation.total_latency, b.schedule)
        for p, b in runs.items()
        if b.evaluation is not None and b.schedule is not None
    }


def _forced(
    jobs: list[Job],
    limits: Limits,
    cost_model: CostModel,
    base: CspOptions,
    opt: CspResult,
    ok: dict[str, tuple[float, Schedule]],
    row: dict[str, object],
) -> dict[str, object]:
    """The best schedule with at least one eviction, and what evicting costs."""
    if opt.evictions:
        lat, status = opt.latency, opt.status
    else:
        cands = [c for c in ok.values() if c[1].evictions > 0]
        if not cands:
            # no preset evicts here (vLLM's 1% watermark keeps the second prompt out);
            # without the watermark vLLM admits two prompts and must evict: a seed
            sched, _run = record_policy("vllm", jobs, cost_model, limits, {"watermark": 0.0})
            if sched.evictions:
                cands = [(evaluate(sched, jobs, cost_model, limits).total_latency, sched)]
        hint = _best_schedule(cands)
        forced = solve(
            jobs, limits, cost_model, dataclasses.replace(base, min_evictions=1), hint=hint
        )
        lat, status = forced.latency, forced.status
    ef = row["best_ef_latency"]
    cost = (lat - ef) / lat * 100 if lat and isinstance(ef, float) else float("nan")
    return {"best_evicting_latency": lat, "best_evicting_status": status, "eviction_cost_pct": cost}


def schedule_text(schedule: Schedule | None) -> str:
    """A schedule in one line: batches separated by ``|``, ``rID:TOKENS``, ``!rID`` evicts."""
    if schedule is None:
        return ""
    return " | ".join(
        " ".join([*(f"!r{r}" for r in b.evict), *(f"r{r}:{n}" for r, n in b.entries)])
        for b in schedule.batches
    )


def _best_schedule(cands: list[tuple[float, Schedule]]) -> Schedule | None:
    return min(cands, key=lambda c: c[0])[1] if cands else None


def _row(
    inp: int,
    limits: Limits,
    opt: CspResult,
    ef: CspResult,
    best_preset: str,
    best_preset_latency: float,
    J: int,
) -> dict[str, object]:
    opt_lat = opt.latency
    ef_lat = ef.latency
    if opt_lat is not None and opt.evictions == 0 and (ef_lat is None or opt_lat < ef_lat):
        ef_lat = opt_lat  # the evicting solve found a better eviction-free schedule
    gap_pct = (ef_lat - opt_lat) / ef_lat * 100 if opt_lat is not None and ef_lat else float("nan")
    return {
        "I": inp,
        "M": limits.kv_capacity_tokens,
        "optimal_latency": opt_lat,
        "optimal_evictions": opt.evictions,
        "status": opt.status,
        "gap": opt.gap,
        "best_ef_latency": ef_lat,
        "best_ef_status": ef.status,
        "best_preset": best_preset,
        "best_preset_latency": best_preset_latency,
        "latency_gap_pct": gap_pct,
        "ef_gap": ef.gap,
        "optimal_batches": opt.schedule.num_batches if opt.schedule else None,
        "max_batches": J,
        "batches_sufficient": opt.batches_sufficient,
        "solve_seconds": opt.solve_seconds + ef.solve_seconds,
        "optimal_schedule": schedule_text(opt.schedule),
    }
