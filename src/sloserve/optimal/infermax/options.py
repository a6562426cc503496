"""What the InferMax CSP (§3.3 of ``papers/infermax.txt``) is asked and what it answers:
:class:`CspOptions`, :class:`CspResult`, the engine-run :class:`Baseline` policies it is
seeded with and compared against, and the limits of what it accepts.

Choices where the paper is vague (parameters of :class:`CspOptions`): the number of
batches J (default: the warm-start schedule's batch count, see
``batches_sufficient`` in the result for when J provably does not cut the optimum off);
identical requests are ordered by finish time (symmetry breaking; any schedule can be
relabelled so); hybrid batching, chunked prefill and eviction can each be forbidden; the
"at least x% better than scheduler S" query is a constraint objective ≤ (1 − x/100)·S;
``min_evictions`` forces evictions (the best schedule that evicts, to measure their cost).

OR-Tools is imported only when a model is solved (:func:`_cp_model`); a missing install is
a :class:`SolverUnavailable` naming the extra that provides it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sloserve.core.bounds import Seconds, Seed, check_value
from sloserve.core.errors import ConfigError, SloserveError, UnknownNameError
from sloserve.costmodel.base import ConstantCostModel, CostModel
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel
from sloserve.engine.interface import Limits
from sloserve.optimal.infermax.replay import record_policy
from sloserve.optimal.infermax.schedule import Evaluation, Job, Schedule, evaluate

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
        check_value(Seconds, self.time_limit_s, "time_limit_s")
        if self.deterministic_limit is not None:
            check_value(Seconds, self.deterministic_limit, "deterministic_limit")
        check_value(Seed, self.seed, "seed")
        # Policy names are checked before any solving, with the valid ones listed.
        from sloserve.policies.registry import policy_names

        valid = policy_names()
        for name in (*(self.warm_start or ()), *([self.better_than] if self.better_than else [])):
            if name not in valid:
                raise UnknownNameError(f"unknown policy {name!r}; valid: {', '.join(valid)}")


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
