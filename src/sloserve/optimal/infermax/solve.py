"""InferMax's optimal schedules by constraint solving (§3.3 of ``papers/infermax.txt``), on
OR-Tools CP-SAT: :func:`solve` checks the instance, runs the warm-start policies
(:mod:`.warm`), builds the model (:mod:`.model`), searches, and reads the schedule back
from the solution; :func:`batches_needed` says when J cannot cut off the optimum.

Search: the warm start (the best of some policies run through the engine, or a given
schedule) is turned into a complete hint by propagation before the search, so the answer
is never worse than it; redundant linear cuts (batch time ≥ the shortest batch and ≥ its
token term, F_i ≥ batches before i finishes × the shortest batch, O·done ≤ G) tighten the
LP bound. The status is always reported: ``optimal``, ``feasible`` (with the gap to the
proven bound), ``infeasible`` (e.g. no schedule within J batches, or none better than the
target) or ``unknown`` (the limit hit before any solution).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.engine.interface import Limits
from sloserve.optimal.infermax.model import _build, _Built
from sloserve.optimal.infermax.options import (
    MAX_CELLS,
    MAX_TOKENS,
    Baseline,
    CspOptions,
    CspResult,
    Status,
    _cp_model,
    linear_coefficients,
    run_baseline,
)
from sloserve.optimal.infermax.schedule import Job, Schedule, ScheduledBatch, evaluate
from sloserve.optimal.infermax.warm import (
    _add_hint,
    _canonical_hint,
    _complete_hint,
    _feasible_for,
    default_warm_start,
)


def _min_batch_time(cost_model: CostModel) -> float:
    """A lower bound on any non-empty batch's time (non-negative coefficients): at least
    one token, and either one decode or a prefill of work ≥ 1."""
    one_decode = cost_model.batch_time(BatchStats(num_decode=1, decode_context_sum=1))
    one_prefill = cost_model.batch_time(
        BatchStats(num_prefill_tokens=1, num_prefill_seqs=1, prefill_attn_work=1)
    )
    return min(one_decode, one_prefill)


def batches_needed(
    jobs: Sequence[Job], value: float, objective: str, cost_model: CostModel
) -> int | None:
    """The most batches a schedule whose ``objective`` is at most ``value`` can use (None
    for the TTFT and TPOT objectives, which do not bound it).

    A schedule with K busy batches has makespan ≥ K·t_min (t_min: the shortest possible
    batch). For total latency the last request to finish contributes ≥ K·t_min − max T and
    every other one ≥ O_i batches (one per token)·t_min. So a J ≥ this bound cannot cut off
    a schedule better than ``value``.
    """
    t_min = _min_batch_time(cost_model)
    if objective not in ("latency", "makespan") or not t_min > 0:
        return None
    v = value * (1 + 1e-9)
    if objective == "makespan":
        return math.floor(v / t_min)
    outs = [j.output_tokens for j in jobs]
    slack = max(j.arrival_s for j in jobs)
    return max(0, math.floor((v + slack) / t_min - (sum(outs) - max(outs))))


def solve(
    jobs: Sequence[Job],
    limits: Limits,
    cost_model: CostModel,
    options: CspOptions | None = None,
    *,
    hint: Schedule | None = None,
) -> CspResult:
    """Solve the CSP for ``jobs`` under ``limits``; see this module's docstring and
    :mod:`.model`'s.

    ``hint``: a schedule to seed the search with instead of running warm-start policies.
    """
    opts = options or CspOptions()
    if not jobs:
        raise ConfigError("the CSP needs at least one request")
    if limits.block_size != 1:
        raise ConfigError("the CSP counts KV token-exactly: block size must be 1")
    if len({j.req_id for j in jobs}) != len(jobs):
        raise ConfigError("request ids must be unique")
    for j in jobs:
        if j.max_kv > limits.kv_capacity_tokens:
            raise ConfigError(
                f"request {j.req_id} needs {j.max_kv} KV tokens (I+O-1) "
                f"> M={limits.kv_capacity_tokens}"
            )
    tokens = sum(j.max_kv for j in jobs)
    if tokens > MAX_TOKENS:
        raise ConfigError(
            f"instance too large for the CSP: {tokens} KV tokens (Σ I+O-1) > {MAX_TOKENS}"
        )
    if len(jobs) * max(j.output_tokens for j in jobs) > MAX_CELLS:
        raise ConfigError(
            f"instance too large for the CSP: {len(jobs)} requests × at least "
            f"{max(j.output_tokens for j in jobs)} batches > {MAX_CELLS} cells"
        )
    # M beyond 2·Σ(I+O) never binds, neither the CSP nor a preset (vLLM's 1% watermark
    # included): cap it so that the engine runs do not allocate a huge free list
    m_cap = 2 * sum(j.input_tokens + j.output_tokens for j in jobs)
    if limits.kv_capacity_tokens > m_cap:
        limits = dataclasses.replace(limits, kv_capacity_tokens=m_cap)
    coef = linear_coefficients(cost_model)
    cp_model = _cp_model()

    # ---- baselines: warm start and the better-than reference ---------------------------
    baselines: dict[str, Baseline] = {}
    names = default_warm_start(opts) if opts.warm_start is None else opts.warm_start
    wanted = list(dict.fromkeys([*names, *([opts.better_than] if opts.better_than else [])]))
    for name in wanted:
        baselines[name] = run_baseline(name, jobs, cost_model, limits)
    warm_name: str | None = None
    if hint is not None:
        hint_eval = evaluate(hint, jobs, cost_model, limits)
        warm_name = str(hint.meta.get("source", "hint"))
    else:
        hint_eval = None
        best: tuple[float, str] | None = None
        for name in names:
            b = baselines[name]
            if b.evaluation is None or b.schedule is None:
                continue
            if not _feasible_for(b.schedule, opts, jobs):
                continue
            v = b.evaluation.metric(opts.objective)
            if best is None or v < best[0]:
                best = (v, name)
        if best is not None:
            warm_name = best[1]
            hint = baselines[warm_name].schedule
            hint_eval = baselines[warm_name].evaluation

    if hint is not None and hint_eval is not None and opts.symmetry_breaking:
        hint, hint_eval = _canonical_hint(hint, hint_eval, jobs, cost_model, limits)

    if opts.max_batches is not None:
        J = opts.max_batches
    elif hint is not None:
        J = hint.num_batches
    else:
        # Enough to serve the requests one after another, prompts in P-sized chunks.
        J = sum(
            math.ceil(j.input_tokens / limits.max_prefill_tokens) + j.output_tokens - 1
            for j in jobs
        )
    if len(jobs) * J > MAX_CELLS:
        raise ConfigError(
            f"instance too large for the CSP: {len(jobs)} requests × J={J} batches > "
            f"{MAX_CELLS} cells (pass a smaller --max-batches or fewer requests)"
        )
    sufficient: bool | None = None
    need: int | None = None
    if hint_eval is not None:
        need = batches_needed(jobs, hint_eval.metric(opts.objective), opts.objective, cost_model)

    unit = opts.time_unit_s

    def q(x: float) -> int:
        return round(x / unit)

    model = cp_model.CpModel()
    t0 = time.perf_counter()
    built = _build(model, cp_model, jobs, limits, coef, J, opts, q, _min_batch_time(cost_model))

    target: float | None = None
    if opts.better_than:
        ref = baselines[opts.better_than]
        if ref.evaluation is None:
            raise ConfigError(
                f"--better-than policy {opts.better_than!r} could not serve the instance: "
                f"{ref.error}"
            )
        target = ref.evaluation.metric(opts.objective) * (1 - opts.better_by_pct / 100)
        model.Add(built.objective <= math.floor(target / unit * built.obj_scale))
        # any schedule meeting the target uses at most this many batches: with J at least
        # that, "infeasible" means no schedule at all is that much better
        by_target = batches_needed(jobs, target, opts.objective, cost_model)
        if by_target is not None and (need is None or by_target < need):
            need = by_target
    sufficient = None if need is None else need <= J

    model.Minimize(built.objective)
    hinted = False
    if hint is not None and hint_eval is not None and hint.num_batches <= J:
        _add_hint(model, built, hint, hint_eval, jobs, q)
        hinted = _complete_hint(model, cp_model, min(opts.time_limit_s, 30.0))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = opts.time_limit_s
    if opts.deterministic_limit is not None:
        solver.parameters.max_deterministic_time = opts.deterministic_limit
    solver.parameters.num_workers = opts.workers or min(8, os.cpu_count() or 1)
    solver.parameters.random_seed = opts.seed
    if len(model.Proto().variables) > 4000:
        # probing can eat the whole budget on large models (measured: 16 s of a 20 s limit
        # at N = 8, J = 124, 18k variables, before the search even starts); on small ones
        # it is what proves optimality, so only large models get it capped
        probe = min(1.0, 0.005 * opts.time_limit_s)
        solver.parameters.presolve_probing_deterministic_time_limit = probe
        solver.parameters.probing_deterministic_time_limit = probe
    solver.parameters.log_search_progress = opts.log
    code = solver.Solve(model)
    elapsed = time.perf_counter() - t0
    status_names: dict[Any, Status] = {
        cp_model.OPTIMAL: "optimal",
        cp_model.FEASIBLE: "feasible",
        cp_model.INFEASIBLE: "infeasible",
    }
    status: Status = status_names.get(code, "unknown")
    if code == cp_model.MODEL_INVALID:  # a bug in _build, never the user's input
        raise RuntimeError(f"CP-SAT rejected the model: {model.Validate()}")
    stats = {
        "variables": len(model.Proto().variables),
        "constraints": len(model.Proto().constraints),
        "hinted": hinted,
        "batches_needed": need,
        "workers": solver.parameters.num_workers,
        "time_unit_s": unit,
        "deterministic_time": solver.ResponseProto().deterministic_time,
        "wall_time": solver.WallTime(),
    }
    if status in ("infeasible", "unknown"):
        return CspResult(
            status,
            None,
            None,
            None,
            elapsed,
            J,
            None,
            None,
            sufficient,
            warm_name,
            baselines,
            target,
            stats,
        )
    obj_units = solver.ObjectiveValue()
    bound_units = solver.BestObjectiveBound()
    scale = unit / built.obj_scale
    obj = obj_units * scale
    bound = max(bound_units * scale, 0.0)  # every objective is a sum of durations ≥ 0
    gap = 0.0 if status == "optimal" else (obj - bound) / obj if obj > 0 else 0.0
    sched = _extract(solver, built, jobs, J, opts, warm_name)
    evaluation = evaluate(sched, jobs, cost_model, limits)
    stats["kept_warm_start"] = False
    if (
        hinted
        and hint is not None
        and hint_eval is not None
        and hint_eval.metric(opts.objective) < evaluation.metric(opts.objective)
    ):
        # the integer-rounded costs ranked the solution first; priced exactly, the warm
        # start (feasible for every constraint: the hint was completed) is better
        sched, evaluation = hint, hint_eval
        stats["kept_warm_start"] = True
    # the schedule found bounds the batches any better one can use: often tighter
    found = batches_needed(jobs, evaluation.metric(opts.objective), opts.objective, cost_model)
    if found is not None and (need is None or found < need):
        need = found
        sufficient = need <= J
    stats["batches_needed"] = need
    return CspResult(
        status,
        obj,
        bound,
        max(gap, 0.0),
        elapsed,
        J,
        sched,
        evaluation,
        sufficient,
        warm_name,
        baselines,
        target,
        stats,
    )


def _extract(
    solver: Any, built: _Built, jobs: Sequence[Job], J: int, opts: CspOptions, warm: str | None
) -> Schedule:
    batches: list[ScheduledBatch] = []
    for jj in range(1, J + 1):
        if not solver.BooleanValue(built.used[jj - 1]):
            break
        entries = tuple(
            (job.req_id, int(solver.Value(built.c[i, jj])))
            for i, job in enumerate(jobs)
            if solver.Value(built.c[i, jj]) > 0
        )
        evict = tuple(
            job.req_id
            for i, job in enumerate(jobs)
            if opts.allow_eviction and solver.BooleanValue(built.e[i, jj])
        )
        batches.append(ScheduledBatch(entries, evict))
    return Schedule(
        tuple(batches),
        {"source": "csp", "objective": opts.objective, "warm_start": warm},
    )
