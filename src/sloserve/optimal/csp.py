"""InferMax's optimal schedules by constraint solving (§3.3), on OR-Tools CP-SAT.

Given requests ``i`` (input I_i, output O_i, arrival T_i) and up to ``J`` batches ``j``,
the model chooses for every (i, j) the tokens ``c[i,j]`` request i processes in batch j and
whether it is evicted there (``e[i,j]``), and minimises total latency (or mean TTFT, mean
TPOT, makespan) priced by the linear cost model. The engine's own accounting is modelled
exactly, so that a solution replays through the engine with the same latencies
(:mod:`sloserve.optimal.schedule`).

Variables, in the paper's names (state "after batch j"; j = 0 is the initial state):

* ``c[i,j]`` tokens processed; ``cz[i,j]`` = c > 0 (request in the batch);
* ``m[i,j]`` KV tokens held during batch j (0 once finished; ``mz`` = m > 0);
* ``e[i,j]`` evicted (recompute) at the start of batch j;
* ``g[i,j]`` a token generated; ``G[i,j]`` = Σ_{j'≤j} g (tokens generated so far);
* the paper's input size ``I[i,j]`` is ``I_i + G[i,j]``: what a refill must recompute. The
  paper stores it separately and updates it on an eviction in the decode phase (its
  constraint (2)); here it is derived, which is the same quantity;
* ``d[i,j]``: the batch-j entry of request i is a decode. The paper's d is "all prompt
  tokens processed" (m ≥ I); the engine calls any 1-token step of a request that has
  generated tokens and has one token left a decode (including the last token of a chunked
  refill), and so does this model, so that batch costs match the engine;
* ``dg`` = d ∧ g (decode entries; they do not count against P), ``pf`` = cz ∧ ¬d (prefill
  entries), ``done[i,j]`` = G ≥ O_i.

Constraints: (1) termination Σ_j g = O_i; (2)+(3) memory management: m = 0 when evicted or
finished, else m[j] = m[j-1] + c[j] and m ≤ I_i + G[j-1] (no decode before the prompt is
done); g ⇔ m reaches I_i + G[j-1]; (4) c = 0 when evicted, c ≤ 1 in decode; (5) per batch
Σc ≤ C, Σc − Σdg ≤ P, Σm ≤ M, Σmz ≤ R_max. An eviction needs KV to drop, and happens in a
batch that runs something (the engine cannot run an empty iteration). Conditional
constraints use CP-SAT enforcement literals instead of the paper's Big-M rows (same
meaning; CP-SAT propagates them better).

Cost of batch j, in integer time units (``time_unit_s``, default 10 ps), coefficient by
coefficient from :class:`~sloserve.costmodel.linear.LinearCoefficients`:
``used·(intercept + comm_intercept) + max(floor, token_intercept + per_token·T) +
comm_per_token·T + decode_intercept·[any decode] + per_decode_seq·D + per_decode_kv·Σ ctx +
prefill_intercept·[any prefill] + per_prefill_seq·#prefills + per_prefill_work·Σ c·(c + m_prev)``,
with T = Σ c, D = #decodes, ctx = m_prev of each decode. The prefill attention work is
quadratic: ``c·(c + m_prev) = c·m`` for a prefill entry, one ``AddMultiplicationEquality``
per (i, j) — exact, not restricted. Each coefficient is rounded to the time unit, so the
objective differs from the engine's float cost by up to ~0.5 unit × what the coefficient
multiplies (tokens, KV read, attention work: measured ~1e-5 s, 4e-5 relative, at I = 1000
with the A100 profile); should that rounding make the solved schedule cost more (priced
in float) than the warm start, the warm start is returned (``stats["kept_warm_start"]``).
Results report both (``objective`` from the solver, ``latency`` from pricing the solved
schedule with the cost model itself). Batch start ``S_j = max(E_{j-1}, T_i of every request
in batch j)`` (online variant: nothing of i runs before it arrives, the GPU idles only while
it waits), end ``E_j = S_j + t_j`` (the paper's Acc_j).

Objectives: ``latency`` Σ_i (F_i − T_i), F_i the end of i's last batch (the default;
equivalently mean latency); ``ttft`` mean_i (first token − T_i); ``tpot`` Σ_i (F_i −
first)/(O_i − 1) over O_i > 1, as a mean (weights scaled to integers by their lcm);
``makespan`` E_J.

Choices where the paper is vague (parameters of :class:`CspOptions`): the number of
batches J (default: the warm-start schedule's batch count, see
``batches_sufficient`` in the result for when J provably does not cut the optimum off);
identical requests are ordered by finish time (symmetry breaking; any schedule can be
relabelled so); hybrid batching, chunked prefill and eviction can each be forbidden; the
"at least x% better than scheduler S" query is a constraint objective ≤ (1 − x/100)·S;
``min_evictions`` forces evictions (the best schedule that evicts, to measure their cost).

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
from dataclasses import dataclass, field
from typing import Any, Literal

from sloserve.core.errors import ConfigError, SloserveError
from sloserve.costmodel.base import BatchStats, ConstantCostModel, CostModel
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel
from sloserve.engine.interface import Limits
from sloserve.optimal.schedule import (
    Evaluation,
    Job,
    Schedule,
    ScheduledBatch,
    evaluate,
    record_policy,
)

Objective = Literal["latency", "ttft", "tpot", "makespan"]
OBJECTIVES: tuple[str, ...] = ("latency", "ttft", "tpot", "makespan")
Status = Literal["optimal", "feasible", "infeasible", "unknown"]

INSTALL_HINT = "pip install 'sloserve[solver]'"

MAX_TOKENS = 10_000_000
"""Largest Σ (I + O − 1) the CSP accepts: the warm-start runs allocate KV token-exactly."""
MAX_CELLS = 200_000
"""Largest requests × batches (N·J) the CSP builds (about 20 variables per cell); larger
instances are refused with a ConfigError instead of exhausting memory while building."""


class SolverUnavailable(SloserveError, ImportError):
    """OR-Tools is not installed; the message names the extra that provides it."""


def _cp_model() -> Any:
    try:
        from ortools.sat.python import cp_model
    except ImportError as e:  # pragma: no cover - the dev environment has it
        raise SolverUnavailable(f"the InferMax CSP needs OR-Tools CP-SAT: {INSTALL_HINT}") from e
    return cp_model


def linear_coefficients(cost_model: CostModel) -> LinearCoefficients:
    """The coefficients the CSP prices batches with; only linear-form models with finite
    coefficients qualify."""
    if isinstance(cost_model, LinearCostModel):
        coef = cost_model.c
    elif isinstance(cost_model, ConstantCostModel):
        coef = LinearCoefficients(token_floor=cost_model.iteration_s)
    else:
        raise ConfigError(
            "the CSP needs a linear cost model (a profile or constant:SECONDS), "
            f"got {cost_model.name!r}"
        )
    bad = [k for k, v in coef.model_dump().items() if not math.isfinite(v)]
    if bad:
        raise ConfigError(f"cost model {cost_model.name!r}: non-finite coefficients {bad}")
    return coef


@dataclass(frozen=True)
class CspOptions:
    """What to solve and how (every field has a default)."""

    objective: Objective = "latency"
    max_batches: int | None = None
    """J. None: the warm start's batch count (so the warm start is always a solution; a
    larger J can only help but makes the search much harder), or without a warm start
    enough batches to serve the requests one after another."""
    allow_eviction: bool = True
    allow_hybrid: bool = True
    """Prefill and decode entries in one batch."""
    allow_chunked_prefill: bool = True
    """A prefill entry may stop short of the request's full (re)fill."""
    time_limit_s: float = 10.0
    """Wall-clock limit of the search (model building and warm-start runs not included)."""
    deterministic_limit: float | None = None
    """CP-SAT's deterministic-time limit (machine-load independent; about seconds). With
    ``workers=1`` the answer is then the same on every run and every machine load."""
    workers: int | None = None
    """CP-SAT search workers; None: min(8, CPU count)."""
    seed: int = 0
    time_unit_s: float = 1e-11
    """Integer time resolution of the model."""
    warm_start: tuple[str, ...] | None = None
    """Policies (registry names) run through the engine first; the best feasible one's
    schedule is the hint (AddHint). None: vllm, sarathi and their eviction-free variants,
    filtered by the forbidden features. () disables the warm start."""
    better_than: str | None = None
    """Policy S: require objective ≤ (1 − better_by_pct/100)·objective(S)."""
    better_by_pct: float = 0.0
    min_evictions: int = 0
    """Require at least this many evictions (e.g. 1: the best schedule that evicts, to
    measure what evicting costs, as §4.5 does for long inputs)."""
    symmetry_breaking: bool = True
    log: bool = False

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"unknown objective {self.objective!r}; valid: {', '.join(OBJECTIVES)}"
            )
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError("max_batches must be >= 1")
        if not self.time_limit_s > 0:
            raise ConfigError("time_limit_s must be > 0")
        if self.workers is not None and self.workers < 1:
            raise ConfigError("workers must be >= 1")
        if self.min_evictions < 0 or (self.min_evictions and not self.allow_eviction):
            raise ConfigError("min_evictions must be >= 0, and 0 when eviction is forbidden")
        if not 0 <= self.better_by_pct < 100:
            raise ConfigError("better_by_pct must be in [0, 100)")
        if not self.time_unit_s > 0:
            raise ConfigError("time_unit_s must be > 0")


@dataclass(frozen=True)
class Baseline:
    """A policy run through the engine on the same instance."""

    policy: str
    schedule: Schedule | None
    evaluation: Evaluation | None
    error: str = ""


@dataclass(frozen=True)
class CspResult:
    """The solver's answer. ``status`` is always set; the schedule only when one was found."""

    status: Status
    objective: float | None
    """Objective in seconds as the solver computed it (integer time units × unit)."""
    bound: float | None
    """The solver's proven lower bound on the objective, in seconds."""
    gap: float | None
    """(objective − bound) / objective; 0 when optimal."""
    solve_seconds: float
    num_batches_limit: int
    schedule: Schedule | None
    evaluation: Evaluation | None
    """The solved schedule priced by the float cost model (what the engine charges)."""
    batches_sufficient: bool | None
    """True when J provably cannot cut off a better schedule (latency/makespan objectives):
    J ≥ ``stats["batches_needed"]``, from the warm start or the schedule found (see
    :func:`batches_needed`). Pass ``max_batches`` ≥ that to make ``optimal`` global."""
    warm_start: str | None
    baselines: dict[str, Baseline] = field(default_factory=dict)
    target: float | None = None
    """The better-than constraint's bound in seconds, when one was set."""
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def latency(self) -> float | None:
        return self.evaluation.total_latency if self.evaluation else None

    @property
    def evictions(self) -> int | None:
        return self.evaluation.evictions if self.evaluation else None

    def summary(self) -> dict[str, Any]:
        """The JSON-able headline (``sloserve optimal --json``)."""
        ev = self.evaluation
        return {
            "status": self.status,
            "objective": self.objective,
            "bound": self.bound,
            "gap": self.gap,
            "latency": ev.total_latency if ev else None,
            "mean_latency": ev.mean_latency if ev else None,
            "mean_ttft": ev.mean_ttft if ev else None,
            "mean_tpot": ev.mean_tpot if ev else None,
            "makespan": ev.makespan if ev else None,
            "evictions": ev.evictions if ev else None,
            "num_batches": self.schedule.num_batches if self.schedule else None,
            "max_batches": self.num_batches_limit,
            "batches_sufficient": self.batches_sufficient,
            "batches_needed": self.stats.get("batches_needed"),
            "solve_seconds": self.solve_seconds,
            "warm_start": self.warm_start,
            "target": self.target,
            "baselines": {
                name: (b.evaluation.metric("latency") if b.evaluation else None)
                for name, b in self.baselines.items()
            },
        }


def policy_limits(policy: str, limits: Limits) -> Limits:
    """The limits a preset runs under on this instance: its own P when smaller (Sarathi's
    512), never more than the instance's; token-exact KV."""
    from sloserve.policies.registry import make_policy

    sched = make_policy(policy)
    p = limits.max_prefill_tokens
    if sched.chunked_prefill and sched.default_prefill_tokens:
        p = min(p, sched.default_prefill_tokens)
    return Limits(limits.max_batch_tokens, p, limits.kv_capacity_tokens, limits.max_running, 1)


def run_baseline(
    policy: str, jobs: Sequence[Job], cost_model: CostModel, limits: Limits
) -> Baseline:
    """Run a registered policy on the instance; a policy that cannot serve it (stall,
    rejection, swap) is reported with its error instead of a schedule."""
    try:
        sched, run = record_policy(policy, jobs, cost_model, policy_limits(policy, limits))
        if not run.all_finished:
            return Baseline(policy, None, None, "not every request finished (rejected?)")
        return Baseline(policy, sched, evaluate(sched, jobs, cost_model, limits))
    except SloserveError as e:
        return Baseline(policy, None, None, str(e))


def default_warm_start(options: CspOptions) -> tuple[str, ...]:
    names = ["vllm", "vllm-ef", "sarathi", "sarathi-ef"]
    if not options.allow_eviction:
        names = [n for n in names if n.endswith("-ef")]
    if not options.allow_hybrid:
        names = [n for n in names if n.startswith("vllm")]
    if not options.allow_chunked_prefill:
        names = [n for n in names if not n.startswith("sarathi")]
    return tuple(names)


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


def _feasible_for(sched: Schedule, options: CspOptions, jobs: Sequence[Job]) -> bool:
    """Whether a recorded schedule respects the forbidden features (for use as a hint)."""
    if not options.allow_eviction and sched.evictions:
        return False
    if sched.evictions < options.min_evictions:
        return False
    if options.allow_hybrid and options.allow_chunked_prefill:
        return True
    by_id = {j.req_id: j for j in jobs}
    computed = dict.fromkeys(by_id, 0)
    out = dict.fromkeys(by_id, 0)
    for b in sched.batches:
        for r in b.evict:
            computed[r] = 0
        kinds = set()
        for r, n in b.entries:
            remaining = by_id[r].input_tokens + out[r] - computed[r]
            decode = out[r] > 0 and remaining == 1
            kinds.add(decode)
            if not decode and n < remaining and not options.allow_chunked_prefill:
                return False
            computed[r] += n
            if computed[r] == by_id[r].input_tokens + out[r]:
                out[r] += 1
        if len(kinds) > 1 and not options.allow_hybrid:
            return False
    return True


def _canonical_hint(
    hint: Schedule, ev: Evaluation, jobs: Sequence[Job], cost_model: CostModel, limits: Limits
) -> tuple[Schedule, Evaluation]:
    """Relabel identical requests (same I, O, T) of ``hint`` so that they finish in the
    order the symmetry breaking requires (by position in ``jobs``); otherwise the hint
    violates it and is lost. Relabelling identical requests changes no time."""
    classes: dict[tuple[int, int, float], list[int]] = {}
    for j in jobs:
        classes.setdefault((j.input_tokens, j.output_tokens, j.arrival_s), []).append(j.req_id)
    mapping: dict[int, int] = {}
    for ids in classes.values():
        by_finish = sorted(ids, key=lambda r: (ev.finish[r], ids.index(r)))
        mapping.update(zip(by_finish, ids, strict=True))
    if all(a == b for a, b in mapping.items()):
        return hint, ev
    batches = tuple(
        ScheduledBatch(
            tuple((mapping[r], n) for r, n in b.entries), tuple(mapping[r] for r in b.evict)
        )
        for b in hint.batches
    )
    relabelled = Schedule(batches, hint.meta)
    return relabelled, evaluate(relabelled, jobs, cost_model, limits)


def solve(
    jobs: Sequence[Job],
    limits: Limits,
    cost_model: CostModel,
    options: CspOptions | None = None,
    *,
    hint: Schedule | None = None,
) -> CspResult:
    """Solve the CSP for ``jobs`` under ``limits``; see the module docstring.

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


@dataclass
class _Built:
    c: dict[tuple[int, int], Any]
    e: dict[tuple[int, int], Any]
    m: dict[tuple[int, int], Any]
    G: dict[tuple[int, int], Any]
    used: list[Any]
    end: list[Any]
    objective: Any
    obj_scale: int
    """objective × time unit / obj_scale is the objective in seconds."""
    evictable: bool


def _build(
    model: Any,
    cp: Any,
    jobs: Sequence[Job],
    limits: Limits,
    coef: LinearCoefficients,
    J: int,
    opts: CspOptions,
    q: Any,
    t_min: float,
) -> _Built:
    N = len(jobs)
    C, P, M, R = (
        limits.max_batch_tokens,
        limits.max_prefill_tokens,
        limits.kv_capacity_tokens,
        limits.max_running,
    )
    # integer coefficients
    k_base = q(coef.intercept + coef.comm_intercept)
    k_floor = q(coef.token_floor)
    k_ti = q(coef.token_intercept)
    k_tok = q(coef.per_token)
    k_comm = q(coef.comm_per_token)
    k_dint, k_dseq, k_dkv = q(coef.decode_intercept), q(coef.per_decode_seq), q(coef.per_decode_kv)
    k_pint, k_pseq, k_pw = (
        q(coef.prefill_intercept),
        q(coef.per_prefill_seq),
        q(coef.per_prefill_work),
    )
    cap = [j.max_kv for j in jobs]
    # floored, minus the rounding of the (at most 4) coefficients a minimal batch pays
    t_min_u = max(0, math.floor(t_min * q(1.0)) - 4)  # q(1.0): units per second
    max_tokens = min(C, sum(cap))
    t_max = (
        k_base
        + max(k_floor, k_ti + k_tok * max_tokens)
        + k_comm * max_tokens
        + k_dint
        + k_dseq * N
        + k_dkv * M
        + k_pint
        + k_pseq * N
        + k_pw * max_tokens * M
    )
    horizon = q(max(j.arrival_s for j in jobs)) + J * t_max + 1

    c: dict[tuple[int, int], Any] = {}
    e: dict[tuple[int, int], Any] = {}
    m: dict[tuple[int, int], Any] = {}
    G: dict[tuple[int, int], Any] = {}
    done: dict[tuple[int, int], Any] = {}
    has: dict[tuple[int, int], Any] = {}  # G >= 1
    cz: dict[tuple[int, int], Any] = {}
    dg: dict[tuple[int, int], Any] = {}
    pf: dict[tuple[int, int], Any] = {}
    ctx: dict[tuple[int, int], Any] = {}
    work: dict[tuple[int, int], Any] = {}
    mz: dict[tuple[int, int], Any] = {}
    for i in range(N):
        # j = 0: the initial state
        m[i, 0] = 0
        G[i, 0] = 0
        done[i, 0] = False
        has[i, 0] = False
    false = model.NewConstant(0)
    true = model.NewConstant(1)

    def lit(x: Any) -> Any:
        if isinstance(x, bool):
            return true if x else false
        return x

    for jj in range(1, J + 1):
        for i, job in enumerate(jobs):
            I_i, O_i, k = job.input_tokens, job.output_tokens, cap[i]
            cmax = min(k, C)
            cv = model.NewIntVar(0, cmax, f"c_{i}_{jj}")
            ev = model.NewBoolVar(f"e_{i}_{jj}") if opts.allow_eviction else false
            mv = model.NewIntVar(0, k, f"m_{i}_{jj}")
            gv = model.NewBoolVar(f"g_{i}_{jj}")
            Gv = model.NewIntVar(0, min(O_i, jj), f"G_{i}_{jj}")
            dn = model.NewBoolVar(f"done_{i}_{jj}")
            hs = model.NewBoolVar(f"has_{i}_{jj}")
            czv = model.NewBoolVar(f"cz_{i}_{jj}")
            mzv = model.NewBoolVar(f"mz_{i}_{jj}")
            m_p, G_p, done_p, has_p = (
                m[i, jj - 1],
                G[i, jj - 1],
                lit(done[i, jj - 1]),
                lit(has[i, jj - 1]),
            )
            # cz <=> c > 0, mz <=> m > 0
            model.Add(cv >= 1).OnlyEnforceIf(czv)
            model.Add(cv == 0).OnlyEnforceIf(czv.Not())
            model.Add(mv >= 1).OnlyEnforceIf(mzv)
            model.Add(mv == 0).OnlyEnforceIf(mzv.Not())
            # finished requests hold nothing and do nothing
            model.Add(mv == 0).OnlyEnforceIf(done_p)
            model.Add(cv == 0).OnlyEnforceIf(done_p)
            # eviction: drops the KV (which must exist), runs nothing this batch
            if opts.allow_eviction:
                model.AddImplication(ev, done_p.Not())
                model.Add(cv == 0).OnlyEnforceIf(ev)
                model.Add(mv == 0).OnlyEnforceIf(ev)
                if isinstance(m_p, int):
                    model.Add(ev == 0)
                else:
                    model.Add(m_p >= 1).OnlyEnforceIf(ev)
            # (3) memory: m grows by c, never past the current input I_i + G (no decode
            # before the (re)fill is complete)
            model.Add(mv == m_p + cv).OnlyEnforceIf([ev.Not(), done_p.Not()])
            model.Add(mv <= I_i + G_p)
            # g <=> the (re)fill reaches I_i + G_{j-1}: a token is generated
            model.Add(mv >= I_i + G_p).OnlyEnforceIf(gv)
            model.Add(mv <= I_i + G_p - 1).OnlyEnforceIf(gv.Not())
            model.Add(Gv == G_p + gv)
            model.Add(Gv >= O_i).OnlyEnforceIf(dn)
            model.Add(O_i * dn <= Gv)  # the same, as a linear cut for the LP
            model.Add(Gv <= O_i - 1).OnlyEnforceIf(dn.Not())
            model.Add(Gv >= 1).OnlyEnforceIf(hs)
            model.Add(Gv == 0).OnlyEnforceIf(hs.Not())
            # d: a decode entry = in the batch, has generated, one token left before it
            near = model.NewBoolVar(f"near_{i}_{jj}")
            if isinstance(m_p, int):
                model.Add(near == 0)
            else:
                model.Add(m_p >= I_i + G_p - 1).OnlyEnforceIf(near)
                model.Add(m_p <= I_i + G_p - 2).OnlyEnforceIf(near.Not())
            dgv = model.NewBoolVar(f"dg_{i}_{jj}")
            model.AddBoolAnd([czv, has_p, near]).OnlyEnforceIf(dgv)
            model.AddBoolOr([czv.Not(), has_p.Not(), near.Not()]).OnlyEnforceIf(dgv.Not())
            pfv = model.NewBoolVar(f"pf_{i}_{jj}")
            model.Add(pfv + dgv == czv)
            if not opts.allow_chunked_prefill:
                model.AddImplication(pfv, gv)  # a prefill entry completes the (re)fill
            # decode attention reads m_prev KV tokens
            cx = model.NewIntVar(0, k, f"ctx_{i}_{jj}")
            if isinstance(m_p, int):
                model.Add(cx == 0)
            else:
                model.Add(cx == m_p).OnlyEnforceIf(dgv)
                model.Add(cx == 0).OnlyEnforceIf(dgv.Not())
            # prefill attention work c·(c + m_prev) = c·m for a prefill entry
            prod = model.NewIntVar(0, cmax * k, f"cm_{i}_{jj}")
            model.AddMultiplicationEquality(prod, [cv, mv])
            wv = model.NewIntVar(0, cmax * k, f"w_{i}_{jj}")
            model.Add(wv == prod).OnlyEnforceIf(pfv)
            model.Add(wv == 0).OnlyEnforceIf(pfv.Not())
            c[i, jj], e[i, jj], m[i, jj], G[i, jj] = cv, ev, mv, Gv
            done[i, jj], has[i, jj], cz[i, jj], dg[i, jj] = dn, hs, czv, dgv
            pf[i, jj], ctx[i, jj], work[i, jj], mz[i, jj] = pfv, cx, wv, mzv
        for i in range(N):
            model.Add(G[i, jj] >= G[i, jj - 1])  # implied; helps propagation

    if opts.min_evictions:
        model.Add(sum(e.values()) >= opts.min_evictions)

    # (1) termination
    for i, job in enumerate(jobs):
        model.Add(G[i, J] == job.output_tokens)

    used: list[Any] = []
    start: list[Any] = []
    end: list[Any] = []
    prev_end: Any = 0
    for jj in range(1, J + 1):
        rng = range(N)
        u = model.NewBoolVar(f"used_{jj}")
        model.AddMaxEquality(u, [cz[i, jj] for i in rng])
        used.append(u)
        if jj > 1:
            model.AddImplication(u, used[-2])  # empty batches only at the end
        if opts.allow_eviction:
            for i in rng:
                model.AddImplication(e[i, jj], u)
        T = sum(c[i, jj] for i in rng)
        D = sum(dg[i, jj] for i in rng)
        # (5) batch limits
        model.Add(T <= C)
        model.Add(T - D <= P)
        model.Add(sum(m[i, jj] for i in rng) <= M)
        if R < N:
            model.Add(sum(mz[i, jj] for i in rng) <= R)
        any_d = model.NewBoolVar(f"anyd_{jj}")
        model.AddMaxEquality(any_d, [dg[i, jj] for i in rng])
        any_p = model.NewBoolVar(f"anyp_{jj}")
        model.AddMaxEquality(any_p, [pf[i, jj] for i in rng])
        if not opts.allow_hybrid:
            model.Add(any_d + any_p <= 1)
        # batch time
        lin = model.NewIntVar(min(k_ti, 0), max(k_ti, 0) + k_tok * C, f"lin_{jj}")
        model.Add(lin == k_ti + k_tok * T)
        na_raw = model.NewIntVar(0, max(k_floor, k_ti + k_tok * C, 0), f"naraw_{jj}")
        model.AddMaxEquality(na_raw, [model.NewConstant(k_floor), lin])
        na = model.NewIntVar(0, max(k_floor, k_ti + k_tok * C, 0), f"na_{jj}")
        model.Add(na == na_raw).OnlyEnforceIf(u)
        model.Add(na == 0).OnlyEnforceIf(u.Not())
        dur = model.NewIntVar(0, t_max, f"t_{jj}")
        model.Add(
            dur
            == k_base * u
            + na
            + k_comm * T
            + k_dint * any_d
            + k_dseq * D
            + k_dkv * sum(ctx[i, jj] for i in rng)
            + k_pint * any_p
            + k_pseq * sum(pf[i, jj] for i in rng)
            + k_pw * sum(work[i, jj] for i in rng)
        )
        # S_j = max(E_{j-1}, arrival of every request in the batch); E_j = S_j + t_j
        s = model.NewIntVar(0, horizon, f"S_{jj}")
        arrivals = [q(job.arrival_s) for job in jobs]
        terms = [prev_end if not isinstance(prev_end, int) else model.NewConstant(prev_end)]
        for i in rng:
            if arrivals[i] > 0:
                a = model.NewIntVar(0, arrivals[i], f"arr_{i}_{jj}")
                model.Add(a == arrivals[i] * cz[i, jj])
                terms.append(a)
        if len(terms) == 1:
            model.Add(s == terms[0])
        else:
            model.AddMaxEquality(s, terms)
        # redundant linear cuts (the max and the enforced equalities are weak in the LP)
        model.Add(dur >= (k_base + k_floor) * u)
        model.Add(dur >= (k_base + k_ti) * u + (k_tok + k_comm) * T)
        model.Add(dur >= t_min_u * u)
        en = model.NewIntVar(0, horizon, f"E_{jj}")
        model.Add(en == s + dur)
        start.append(s)
        end.append(en)
        prev_end = en

    # finish and first-token times
    finish: list[Any] = []
    first: list[Any] = []
    for i, job in enumerate(jobs):
        F = model.NewIntVar(0, horizon, f"F_{i}")
        FT = model.NewIntVar(0, horizon, f"FT_{i}")
        for jj in range(1, J + 1):
            fin = model.NewBoolVar(f"fin_{i}_{jj}")
            prev_done = lit(done[i, jj - 1])
            model.AddBoolAnd([done[i, jj], prev_done.Not()]).OnlyEnforceIf(fin)
            model.AddBoolOr([done[i, jj].Not(), prev_done]).OnlyEnforceIf(fin.Not())
            model.Add(end[jj - 1] == F).OnlyEnforceIf(fin)
            fst = model.NewBoolVar(f"first_{i}_{jj}")
            prev_has = lit(has[i, jj - 1])
            model.AddBoolAnd([has[i, jj], prev_has.Not()]).OnlyEnforceIf(fst)
            model.AddBoolOr([has[i, jj].Not(), prev_has]).OnlyEnforceIf(fst.Not())
            model.Add(end[jj - 1] == FT).OnlyEnforceIf(fst)
        # cuts: every batch before i finishes takes at least t_min; each later token of i
        # needs its own batch
        model.Add(t_min_u * sum(1 - lit(done[i, jj - 1]) for jj in range(1, J + 1)) <= F)
        model.Add(FT + t_min_u * (job.output_tokens - 1) <= F)
        finish.append(F)
        first.append(FT)

    if opts.symmetry_breaking:
        # identical requests are interchangeable: order them by finish time
        for a in range(N):
            for b in range(a + 1, N):
                ja, jb = jobs[a], jobs[b]
                if (ja.input_tokens, ja.output_tokens, ja.arrival_s) == (
                    jb.input_tokens,
                    jb.output_tokens,
                    jb.arrival_s,
                ):
                    model.Add(finish[a] <= finish[b])
                    break  # chain to the next identical one only

    arrivals = [q(job.arrival_s) for job in jobs]
    scale = 1
    if opts.objective == "latency":
        objective = sum(finish) - sum(arrivals)
    elif opts.objective == "ttft":
        objective = sum(first) - sum(arrivals)
        scale = N  # mean TTFT
    elif opts.objective == "makespan":
        objective = end[-1]
    else:  # tpot: Σ (F − FT)/(O − 1), weights made integer by their lcm
        multi = [i for i, j in enumerate(jobs) if j.output_tokens > 1]
        if not multi:
            raise ConfigError("the TPOT objective needs a request with output > 1 token")
        scale = math.lcm(*(jobs[i].output_tokens - 1 for i in multi))
        if scale > 10**6:
            raise ConfigError("the TPOT objective's output lengths have too large an lcm")
        objective = sum(
            (scale // (jobs[i].output_tokens - 1)) * (finish[i] - first[i]) for i in multi
        )
        scale *= len(multi)  # so objective·unit/scale is the mean TPOT
    return _Built(c, e, m, G, used, end, objective, scale, opts.allow_eviction)


def _add_hint(
    model: Any,
    built: _Built,
    hint: Schedule,
    ev: Evaluation,
    jobs: Sequence[Job],
    q: Any,
) -> None:
    """Seed the search with a known schedule: its decisions and the states they imply."""
    J = len(built.used)
    ids = [j.req_id for j in jobs]
    for jj in range(1, J + 1):
        b = hint.batches[jj - 1] if jj <= hint.num_batches else ScheduledBatch(())
        run = dict(b.entries)
        state = ev.states[jj - 1] if jj <= hint.num_batches else None
        for i, rid in enumerate(ids):
            model.AddHint(built.c[i, jj], run.get(rid, 0))
            if built.evictable:
                model.AddHint(built.e[i, jj], int(rid in b.evict))
            if state is not None:
                held, gen = state[rid]
                model.AddHint(built.m[i, jj], held)
                model.AddHint(built.G[i, jj], gen)
            else:
                model.AddHint(built.m[i, jj], 0)
                model.AddHint(built.G[i, jj], jobs[i].output_tokens)
        model.AddHint(built.used[jj - 1], int(jj <= hint.num_batches))


def _complete_hint(model: Any, cp_model: Any, time_limit_s: float) -> bool:
    """Turn the partial hint (decisions and states) into a complete one.

    CP-SAT only tries a partial hint heuristically and on large models often loses it (the
    answer could then be worse than the warm start). Solving once with every hinted
    variable fixed fills in the rest (the hint is a valid schedule, so this is pure
    propagation); a complete, feasible hint is CP-SAT's first solution. Returns whether the
    hint is feasible for the model (False, e.g., when a better-than target excludes it).
    """
    fixer = cp_model.CpSolver()
    fixer.parameters.fix_variables_to_their_hinted_value = True
    fixer.parameters.num_workers = 1
    fixer.parameters.max_time_in_seconds = time_limit_s
    if fixer.Solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    values = [
        fixer.Value(model.get_int_var_from_proto_index(k))
        for k in range(len(model.Proto().variables))
    ]
    model.ClearHints()
    for k, v in enumerate(values):
        model.AddHint(model.get_int_var_from_proto_index(k), v)
    return True


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
