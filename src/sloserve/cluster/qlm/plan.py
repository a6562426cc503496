"""QLM's plan generator (§7, Equations 6–13 of ``papers/qlm.txt``): groups → virtual-queue
positions, solved as a MILP with HiGHS (``scipy.optimize.milp``), EDF as the fallback.

The model (one binary ``x[g,i,p]`` per group g, virtual queue i and position p):

- (6) every group takes exactly one position; a position holds at most one group, and the
  filled positions of a queue are a prefix (empty positions sit at the back);
- (7, 8) the model at position p of queue i is ``m[i,p,k] = Σ_{g of model k} x[g,i,p]``;
- (9) the switch indicator ``s[i,p] ≥ m[i,p,k] − m[i,p−1,k]`` (the big-M form of "the model
  changed"), at p=0 against the model the replica serves now;
- (10) cumulative completion ``C[i,p] = T[i,p] + completion(p)``, the start time
  ``T[i,p] = T[i,p−1] + work(p−1) + L_i·s[i,p]`` (``T[i,0] = ready_i + L_i·s[i,0]``), with
  a constant, conservative swap time ``L_i`` per queue (the paper's choice: the slowest
  change of any queued model onto that replica);
- (11, 12) penalty = C − deadline, and the chance constraint P(penalty ≤ 0) ≥ α as its
  deterministic equivalent: every work/completion term is its α-quantile
  (``mean + z_α·σ``; a sum of quantiles bounds the quantile of the sum from above, so the
  plan is conservative), and ``C ≤ deadline + M(1 − x)``;
- (13) objective: the total penalty ``Σ_g (C_g − d_g)``, i.e. the total completion time of
  the groups (the deadlines are constants), through ``c[i,p] ≥ C[i,p] − M·(1 − filled)``.

Choices: positions per queue are ``G`` (exact) when ``G·I·G ≤ max_milp_vars`` (80), else the
problem is too large for an exact solve inside the time budget and the **greedy** plan is
used (counted as ``heuristic``): groups in EDF order, each appended to the queue where its
α-quantile completion, swap included, is earliest. When HiGHS reports the problem
infeasible (no ordering meets every deadline with probability α) or stops at its node
limit (``node_limit``, deterministic: plans do not depend on the machine's speed; the
time limit is only a guard) without a solution, the plan **falls back to EDF**
(Appendix A.3, option b; counted): groups in deadline order, each to the queue with the
least work ahead that serves its model (any queue when none does).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sloserve.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PlanGroup:
    """A group as the planner sees it; per queue i: α-quantile work and completion (s)."""

    gid: int
    model: str
    deadline: float
    """Seconds from now (may be negative: already late)."""
    work: tuple[float, ...]
    completion: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class PlanQueue:
    """A virtual queue (one replica): when it is free, what it serves, its swap time."""

    rid: int
    model: str
    ready: float
    """α-quantile seconds until the work already on the replica is done."""
    swap_s: float
    swap_by_model: tuple[tuple[str, float], ...] = ()
    """Per-model change times where they differ from ``swap_s``: the greedy plan and the
    plan evaluation use them (a Llama-70B load is ten times a 7B one; one constant, the
    slowest, made every change look like the 70B's); the MILP keeps the paper's constant
    ``swap_s`` (Eq. 10)."""

    def swap(self, model: str) -> float:
        """Seconds to change this queue's replica to ``model``."""
        for m, t in self.swap_by_model:
            if m == model:
                return t
        return self.swap_s


@dataclass
class Plan:
    """Virtual queues (replica id → group ids, head first) and how they were found."""

    queues: dict[int, list[int]]
    method: str
    """``milp``, ``heuristic``, ``edf-fallback`` or ``empty``."""
    feasible: bool
    """Whether every group meets its deadline at level α under this plan."""
    solve_s: float = 0.0
    status: str = ""
    completion: dict[int, float] = field(default_factory=dict)
    """α-quantile completion (s from now) of each group under the plan."""


@dataclass(frozen=True)
class PlannerConfig:
    """Solver limits."""

    time_limit_s: float = 5.0
    """A guard only: the node limit is what bounds a solve (deterministic)."""
    max_milp_vars: int = 80
    node_limit: int = 50
    """Branch-and-bound nodes per solve; with no feasible plan by then: EDF fallback."""

    def __post_init__(self) -> None:
        if not 0 < self.time_limit_s <= 3600:
            raise ConfigError(f"time_limit_s: must be in (0, 3600], got {self.time_limit_s}")
        if self.node_limit < 1:
            raise ConfigError(f"node_limit: must be >= 1, got {self.node_limit}")
        if self.max_milp_vars < 0:
            raise ConfigError(f"max_milp_vars: must be >= 0, got {self.max_milp_vars}")


def simulate_plan(
    groups: Sequence[PlanGroup], queues: Sequence[PlanQueue], order: dict[int, list[int]]
) -> dict[int, float]:
    """Each group's completion (s from now) when queues run ``order`` (Eq. 10)."""
    by_id = {g.gid: g for g in groups}
    out: dict[int, float] = {}
    for qi, q in enumerate(queues):
        t, model = q.ready, q.model
        for gid in order.get(q.rid, []):
            g = by_id[gid]
            if g.model != model:
                t += q.swap(g.model)
                model = g.model
            out[gid] = t + g.completion[qi]
            t += g.work[qi]
    return out


def _finish(
    groups: Sequence[PlanGroup],
    queues: Sequence[PlanQueue],
    order: dict[int, list[int]],
    method: str,
    t0: float,
    status: str,
) -> Plan:
    comp = simulate_plan(groups, queues, order)
    ok = all(comp[g.gid] <= g.deadline + 1e-9 for g in groups)
    return Plan(order, method, ok, time.perf_counter() - t0, status, comp)


def _by_deadline(groups: Sequence[PlanGroup]) -> list[PlanGroup]:
    return sorted(groups, key=lambda g: (g.deadline, g.gid))


def edf_plan(groups: Sequence[PlanGroup], queues: Sequence[PlanQueue]) -> dict[int, list[int]]:
    """EDF (the fallback): deadline order, each group to the least-loaded queue serving its
    model now (any queue when none does)."""
    load = [q.ready for q in queues]
    order: dict[int, list[int]] = {q.rid: [] for q in queues}
    for g in _by_deadline(groups):
        cand = [i for i, q in enumerate(queues) if q.model == g.model] or range(len(queues))
        i = min(cand, key=lambda k: (load[k], k))
        order[queues[i].rid].append(g.gid)
        load[i] += g.work[i]
    return order


def greedy_plan(groups: Sequence[PlanGroup], queues: Sequence[PlanQueue]) -> dict[int, list[int]]:
    """Deadline order, each group where its quantile completion (swap included) is earliest."""
    t = [q.ready for q in queues]
    model = [q.model for q in queues]
    order: dict[int, list[int]] = {q.rid: [] for q in queues}
    for g in _by_deadline(groups):
        best, best_c = 0, math.inf
        for i, q in enumerate(queues):
            c = t[i] + (q.swap(g.model) if model[i] != g.model else 0.0) + g.completion[i]
            if c < best_c - 1e-12:
                best, best_c = i, c
        q = queues[best]
        if model[best] != g.model:
            t[best] += q.swap(g.model)
            model[best] = g.model
        t[best] += g.work[best]
        order[q.rid].append(g.gid)
    return order


def generate_plan(
    groups: Sequence[PlanGroup], queues: Sequence[PlanQueue], cfg: PlannerConfig
) -> Plan:
    """The virtual queues for ``groups`` (module docstring)."""
    t0 = time.perf_counter()
    if not queues:
        raise ConfigError("plan: no virtual queue (no replica is up)")
    if not groups:
        return Plan({q.rid: [] for q in queues}, "empty", True, 0.0, "empty")
    n_g, n_q = len(groups), len(queues)
    if n_g * n_q * n_g > cfg.max_milp_vars:
        return _finish(groups, queues, greedy_plan(groups, queues), "heuristic", t0, "too-large")
    order, status = _milp(groups, queues, cfg.time_limit_s, cfg.node_limit)
    if order is None:
        return _finish(groups, queues, edf_plan(groups, queues), "edf-fallback", t0, status)
    return _finish(groups, queues, order, "milp", t0, status)


def _milp(
    groups: Sequence[PlanGroup],
    queues: Sequence[PlanQueue],
    time_limit_s: float,
    node_limit: int,
) -> tuple[dict[int, list[int]] | None, str]:
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    n_g, n_q = len(groups), len(queues)
    n_p = n_g
    models = sorted({g.model for g in groups} | {q.model for q in queues})
    nx, nqp = n_g * n_q * n_p, n_q * n_p

    def xi(g: int, i: int, p: int) -> int:
        return (g * n_q + i) * n_p + p

    def si(i: int, p: int) -> int:  # switch indicator (9)
        return nx + i * n_p + p

    def ci(i: int, p: int) -> int:  # completion counted in the objective (13)
        return nx + nqp + i * n_p + p

    def ti(i: int, p: int) -> int:  # start time of position p (10)
        return nx + 2 * nqp + i * n_p + p

    nv = nx + 3 * nqp
    big = sum(max(g.work) + max(g.completion) for g in groups)
    big += max(q.ready for q in queues) + n_g * max(q.swap_s for q in queues) + 1.0
    big += max(0.0, max(g.deadline for g in groups)) + max(0.0, -min(g.deadline for g in groups))
    rr: list[int] = []
    cc: list[int] = []
    vv: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: dict[int, float], low: float, high: float) -> None:
        k = len(lo)
        for j, v in entries.items():
            rr.append(k)
            cc.append(j)
            vv.append(v)
        lo.append(low)
        hi.append(high)

    for g in range(n_g):  # (6) one position per group
        row({xi(g, i, p): 1.0 for i in range(n_q) for p in range(n_p)}, 1.0, 1.0)
    for i, q in enumerate(queues):
        for p in range(n_p):
            here = {xi(g, i, p): 1.0 for g in range(n_g)}
            row(here, -np.inf, 1.0)  # at most one group per position
            if p + 1 < n_p:  # filled positions are a prefix
                nxt = dict(here)
                for g in range(n_g):
                    nxt[xi(g, i, p + 1)] = -1.0
                row(nxt, 0.0, np.inf)
            for mk in models:  # (9) s[i,p] >= m[i,p,k] - m[i,p-1,k]
                if p == 0 and q.model == mk:
                    continue  # the model it serves now: no switch
                r = {si(i, p): 1.0}
                for g, grp in enumerate(groups):
                    if grp.model == mk:
                        r[xi(g, i, p)] = -1.0
                        if p > 0:
                            r[xi(g, i, p - 1)] = 1.0
                row(r, 0.0, np.inf)
            # (10) T[i,p] = T[i,p-1] + work(p-1) + L·s[i,p]   (T[i,0] = ready + L·s[i,0])
            r = {ti(i, p): 1.0, si(i, p): -q.swap_s}
            if p == 0:
                row(r, q.ready, q.ready)
            else:
                r[ti(i, p - 1)] = -1.0
                for g in range(n_g):
                    r[xi(g, i, p - 1)] = -groups[g].work[i]
                row(r, 0.0, 0.0)
            # (11, 12) T + Σ x (completion - deadline + M) <= M: the group there meets
            # its deadline at level α
            r = {ti(i, p): 1.0}
            for g, grp in enumerate(groups):
                r[xi(g, i, p)] = grp.completion[i] - grp.deadline + big
            row(r, -np.inf, big)
            # (13) c >= T + Σ x completion - M (1 - Σ x)
            r = {ci(i, p): 1.0, ti(i, p): -1.0}
            for g, grp in enumerate(groups):
                r[xi(g, i, p)] = -grp.completion[i] - big
            row(r, -big, np.inf)
    a = coo_matrix((vv, (rr, cc)), shape=(len(lo), nv)).tocsr()
    cost = np.zeros(nv)
    cost[nx + nqp : nx + 2 * nqp] = 1.0
    integrality = np.zeros(nv)
    integrality[: nx + nqp] = 1
    ub = np.full(nv, np.inf)
    ub[: nx + nqp] = 1.0
    res = milp(
        cost,
        constraints=LinearConstraint(a, np.array(lo), np.array(hi)),
        integrality=integrality,
        bounds=Bounds(np.zeros(nv), ub),
        options={"time_limit": time_limit_s, "node_limit": node_limit, "presolve": True},
    )
    if res.x is None:
        status = {1: "timeout", 2: "infeasible"}.get(res.status, f"status-{res.status}")
        return None, status
    x = res.x
    order: dict[int, list[int]] = {}
    for i, q in enumerate(queues):
        order[q.rid] = [
            groups[g].gid for p in range(n_p) for g in range(n_g) if x[xi(g, i, p)] > 0.5
        ]
    return order, "optimal" if res.status == 0 else "time-limit-feasible"


def keeps_incumbent(
    plan: Plan,
    groups: Sequence[PlanGroup],
    queues: Sequence[PlanQueue],
    current: dict[int, list[int]],
) -> bool:
    """Whether the virtual queues in force (``current``) are at least as good as ``plan``
    under the same estimates: fewer predicted deadline misses, or as few and no larger
    total completion (Eq. 13). The queues in force are a solution of the same program
    (a solver warm-started from them returns nothing worse), so a new plan replaces them
    only when it is better; any group not placed in them: the plan wins."""
    placed = [gid for q in queues for gid in current.get(q.rid, [])]
    if sorted(placed) != sorted(g.gid for g in groups):
        return False
    inc = simulate_plan(groups, queues, {q.rid: current.get(q.rid, []) for q in queues})

    def score(comp: dict[int, float]) -> tuple[int, float]:
        late = sum(comp[g.gid] > g.deadline + 1e-9 for g in groups)
        return late, sum(comp.values())

    return score(inc) <= score(plan.completion)
