"""The ``aladdin`` router: Algorithm 1 placement, and §5.2 heartbeat scaling as a controller.

One object is both the cluster's router and its controller (the cluster simulation uses a
router that has ``on_tick`` as its controller when no autoscaler is configured):

- **route**: the request goes to the most loaded UP replica on which Aladdin's constraints
  hold (:class:`~sloserve.cluster.aladdin.placement.Placement`); when none does it is
  held in the cluster's global queue and routed again when a replica frees room or joins.
- **on_event**: a finished (or failed-over) request leaves its worker's ledger; arrivals
  are counted for the rate estimate. With ``rebalance`` on (the default), a finish also
  runs Algorithm 2 (``rebalance.py``): placed requests that have not started on a worker
  whose lengths were underestimated move (the cluster's ``Reroute`` action) to a worker
  that can take them, tried first when the request is routed again.
- **on_tick** (the heartbeat, ``tick_s``; ticks run when ``scaling`` or ``rebalance`` is
  on): Algorithm 2 (with ``rebalance``); with ``scaling`` on: held requests open a
  worker (Algorithm 1's "open a new bin", paid as the cluster's cold start), at most one
  per heartbeat while one is still joining; with a fitted ``k5``/``c5`` the target
  ``N_w = ⌈k5·r_a + c5⌉`` follows the arrival rate after a change point; surplus workers,
  emptiest first, are drained (they finish what they hold, so no request is dropped).

Parameters (``router_params``): ``slo_ttft_ms`` / ``slo_atgt_ms`` (a request's own SLO
wins when it has one; defaults 1600 / 75, Table 2's 70B), ``gamma`` (0.5), ``theta``
(0.9), ``mix`` (the length history, ``sharegpt``), ``scaling`` (False), ``tick_s`` (1.0),
``k5``/``c5`` (unset: no rate target, only held requests open workers), ``min_workers``
(1), ``max_workers`` (256), ``group`` (0), ``rebalance`` (True: Algorithm 2), ``slack``
(``saved``: constraint (d)'s slack, ``placement.py``), ``kv_margin`` (0.05: the share of
the KV cache constraint (e) keeps free, ``placement.py``), ``scheduler_groups`` (1) and
``group_error`` (unset): Appendix A, below; ``overflow`` (what happens when no worker
meets the constraints: ``hold`` in the global queue, the default with ``scaling``, until
a worker frees room or joins (the cluster retries the queue's head whenever a request
ends; arrivals queue behind held requests); a worker with nothing placed is the empty bin
Algorithm 1 would open, so while one is up a request is never held: it goes there even
if it breaks a constraint there (a prompt longer than the TTFT SLO allows would
otherwise wait forever and block the queue); ``least-loaded``, the default without: the
least loaded worker takes it, since Aladdin never blocks a request (§5.3) and a fixed
cluster has no new worker to open), ``oracle_lengths`` (False: True predicts each
request's true output length, the paper's ablation; the router then needs the true
length, which a live gateway does not have, so it is simulation only).

Split prefill/decode (§5.1, a cluster with ``prefill`` and ``decode`` replica groups):
the cluster routes with two router objects; :meth:`AladdinRouter.split_phases` makes this
one the prefill router and the other the decode router. Prefill workers have no queue in
the paper: a prompt goes to the prefill worker with the fewest prompt tokens queued
(then the fewest requests held), never held while one is up. Decode workers are packed
by Algorithm 1 with (b) and (e) only (``Placement.decode_only``); finishes reach the
decode router's ledger through this one (the cluster's controller). Re-balancing has
nothing to move there (a handed-off request waits for KV room, never as a new prompt)
and scaling acts on ``group`` only.

Distributed grouped scheduling (Appendix A; ``scheduler_groups``, ``group_error``): the
up workers are dealt into ``n`` groups by position (worker ``i`` of the list serves group
``i mod n``) and arriving requests into the groups round robin; each request is placed by
Algorithm 1 among its group's workers only, so a decision costs ``1/n`` of a central one.
With ``group_error`` ``e`` set, ``n`` follows the paper's rule that each group needs at
least ``1/(2e)`` workers, ``n = ⌊W / ⌈1/(2e)⌉⌋`` for ``W`` up workers (the paper's upper
bound on a group's rate from the scheduling-latency limit is left to the caller);
otherwise ``n = scheduler_groups`` (1: central scheduling, the default).

Change-point detection (choice): the rate is re-estimated when the arrivals of the last
heartbeat window and of the window before differ by more than three Poisson standard
deviations; otherwise the rate over the whole stable window since the last change is used.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sloserve.cluster.aladdin.lengths import LengthPredictor, OracleLengths, history
from sloserve.cluster.aladdin.perf_models import GIB, PerfModels, fit_models
from sloserve.cluster.aladdin.perf_models import samples_from_cost_model as _grid
from sloserve.cluster.aladdin.placement import SLACKS, Placement, Slo
from sloserve.cluster.aladdin.rebalance import Rebalancer
from sloserve.cluster.controller import Action, AddReplica, Event, RemoveReplica, Reroute
from sloserve.cluster.routing import Decision, Hold, Router, register_router
from sloserve.cluster.view import ClusterView, ReplicaStatus, ReplicaView, RouteRequest
from sloserve.core.errors import ConfigError


class AladdinRouter(Router):
    """Best-fit placement plus heartbeat scaling (module docstring)."""

    name = "aladdin"
    reads_progress = True
    wants_events = True

    def __init__(
        self,
        seed: int = 0,
        *,
        slo_ttft_ms: float = 1600.0,
        slo_atgt_ms: float = 75.0,
        gamma: float = 0.5,
        theta: float = 0.9,
        mix: str = "sharegpt",
        scaling: bool = False,
        tick_s: float = 1.0,
        k5: float | None = None,
        c5: float | None = None,
        min_workers: int = 1,
        max_workers: int = 256,
        group: int = 0,
        rebalance: bool = True,
        oracle_lengths: bool = False,
        slack: str = "saved",
        overflow: str | None = None,
        kv_margin: float = 0.05,
        scheduler_groups: int = 1,
        group_error: float | None = None,
    ) -> None:
        if not 0 <= gamma <= 1:
            raise ConfigError(f"gamma: {gamma} is outside [0, 1]")
        if not 0 < theta <= 1:
            raise ConfigError(f"theta: {theta} is outside (0, 1]")
        if not tick_s > 0:
            raise ConfigError(f"tick_s: {tick_s} must be positive")
        if not 1 <= min_workers <= max_workers:
            raise ConfigError(f"min_workers {min_workers} must be in 1..max_workers")
        self.slo = Slo(slo_ttft_ms / 1e3, slo_atgt_ms / 1e3)
        self.gamma, self.theta = gamma, theta
        self.scaling, self.k5, self.c5 = scaling, k5, c5
        self.rebalance = rebalance
        if slack not in SLACKS:
            raise ConfigError(f"slack: {slack!r} is not one of {', '.join(SLACKS)}")
        self.slack = slack
        if not 0 <= kv_margin < 1:
            raise ConfigError(f"kv_margin: {kv_margin} is outside [0, 1)")
        self.kv_margin = kv_margin
        over = overflow or ("hold" if scaling else "least-loaded")
        if over not in ("hold", "least-loaded"):
            raise ConfigError(f"overflow: {overflow!r} is not one of hold, least-loaded")
        self.overflow = over
        self.tick_s: float | None = tick_s if scaling or rebalance else None
        self.min_workers, self.max_workers, self.group = min_workers, max_workers, group
        p, o = history(mix)
        self.predictor: LengthPredictor = (OracleLengths if oracle_lengths else LengthPredictor)(
            p, o
        )
        self.placement: Placement | None = None
        self.rebalancer: Rebalancer | None = None
        self.phase = "both"
        """``both``; ``prefill`` or ``decode`` once :meth:`split_phases` paired two."""
        self.decode: AladdinRouter | None = None
        """The decode router this prefill router forwards finishes to (split phases)."""
        if scheduler_groups < 1:
            raise ConfigError(f"scheduler_groups: {scheduler_groups} must be >= 1")
        if group_error is not None and not 0 < group_error < 1:
            raise ConfigError(f"group_error: {group_error} is outside (0, 1)")
        self.scheduler_groups, self.group_error = scheduler_groups, group_error
        self._next_group = 0
        self._moves: dict[int | str, int] = {}
        """Algorithm 2's destination of each request it asked the cluster to re-route."""
        self.kv_gib = 0.0
        self._arrivals: list[float] = []
        self._rate_since = 0.0
        self.decisions: list[tuple[float, str, int]] = []
        """(time, ``add``/``remove``, target workers) of each scaling decision."""
        self.true_out: dict[int | str, int] = {}
        """True output lengths (only for ``oracle_lengths``; the simulation fills it)."""
        self.placements = 0
        self.placement_cpu_s = 0.0
        """Algorithm 1 decisions made and the CPU seconds they took (Fig. 13's scheduling
        overhead; measured, so it varies between runs, but it steers nothing)."""

    def bind(self, models: PerfModels, kv_capacity_tokens: int, kv_bytes_per_token: int) -> None:
        """Learn the workers' performance models and KV capacity (once, before routing)."""
        self.kv_gib = kv_capacity_tokens * kv_bytes_per_token / GIB
        decode = self.phase == "decode"
        self.placement = Placement(
            models,
            self.slo,
            self.predictor,
            gamma=self.gamma,
            theta=self.theta,
            slack=self.slack,
            decode_only=decode,
            kv_margin=self.kv_margin,
        )
        self.rebalancer = Rebalancer(self.placement) if self.rebalance and not decode else None

    def split_phases(self, decode: AladdinRouter) -> None:
        """Split prefill/decode (module docstring): this router places prompts on prefill
        workers, ``decode`` (bind it afterwards) packs the decode workers."""
        self.phase, decode.phase, self.decode = "prefill", "decode", decode

    def bind_profile(self, profile: Any, kv_capacity_tokens: int) -> None:
        """:meth:`bind` from a replica profile: the §3 models fitted to its cost model."""
        models = fit_models(_grid(profile.cost_model(), profile.kv_bytes_per_token))
        self.bind(models, kv_capacity_tokens, profile.kv_bytes_per_token)

    # ------------------------------------------------------------------ routing
    def route(self, req: RouteRequest, view: ClusterView) -> Decision:
        pl = self.placement
        if pl is None:
            raise ConfigError("router aladdin: no replica profile bound (use bind_profile)")
        cand = [r for r in view.serving(req.model) if r.status is ReplicaStatus.UP]
        if self.phase == "prefill":  # no queue at the prefill workers (§5.1)
            if not cand:
                return Hold("aladdin: no prefill worker is up")
            best = min(cand, key=lambda r: (r.queued_prompt_tokens, r.outstanding, r.replica_id))
            return best.replica_id
        cand = self._my_group(cand)
        for r in cand:
            pl.add_worker(r.replica_id, self.kv_gib)
        pl.remove(req.req_id)  # routed again (a failover, a re-balancing move): from scratch
        # hold: a worker with nothing placed is the fresh bin Algorithm 1 would open, so a
        # request no worker passes goes to one (the least loaded) rather than wait forever.
        spill = self.overflow == "least-loaded" or any(
            not pl.workers[r.replica_id].requests for r in cand
        )
        t0 = time.process_time()
        wid = pl.place(
            req.req_id,
            max(1, req.prompt_tokens),
            view.now,
            [(r.replica_id, r.queued_prompt_tokens) for r in cand],
            self.true_out.get(req.req_id) if self.predictor.oracle else None,
            prefer=self._moves.pop(req.req_id, None),
            overflow=spill,
        )
        self.placement_cpu_s += time.process_time() - t0
        self.placements += 1
        return Hold("aladdin: no worker meets the constraints") if wid is None else wid

    def groups(self, workers: int) -> int:
        """Scheduler groups for ``workers`` workers (Appendix A; module docstring)."""
        if self.group_error is None:
            return max(1, min(self.scheduler_groups, workers))
        return max(1, workers // math.ceil(1 / (2 * self.group_error)))

    def _my_group(self, cand: list[ReplicaView]) -> list[ReplicaView]:
        """The workers of the scheduler group this request is dealt to (round robin)."""
        n = self.groups(len(cand))
        if n == 1:
            return cand
        g = self._next_group % n
        self._next_group += 1
        return [r for i, r in enumerate(cand) if i % n == g]

    # ------------------------------------------------------------------ controller
    def on_event(self, event: Event, view: ClusterView) -> list[Action]:
        if event.kind == "arrival":
            if self.scaling:  # the rate estimate's window (pruned each heartbeat)
                self._arrivals.append(event.time)
        elif event.kind == "finish" and event.req_id is not None and self.decode is not None:
            return self.decode.on_event(event, view)
        elif event.kind == "finish" and event.req_id is not None and self.placement:
            gone = self.placement.remove(event.req_id)
            if gone is not None and self.rebalancer is not None:
                self.rebalancer.finished(gone[0], gone[1], event.time)
                return self._rebalance(event.time, view)
        return []

    def _rebalance(self, now: float, view: ClusterView) -> list[Action]:
        """Algorithm 2 (``rebalance.py``): re-route unstarted requests of underestimated
        workers; each destination is remembered and tried first when routed again."""
        assert self.rebalancer is not None
        self._moves.clear()  # a move the cluster did not make (the request started) lapses
        up = [r for r in view.replicas() if r.status is ReplicaStatus.UP]
        if not any(r.waiting for r in up):
            return []
        moves = self.rebalancer.plan(
            now,
            {r.replica_id: r.waiting for r in up},
            {r.replica_id: r.queued_prompt_tokens for r in up},
        )
        self._moves.update((m.req_id, m.dst) for m in moves)
        return [Reroute(m.src, int(m.req_id)) for m in moves]

    def rate(self, now: float) -> float:
        """Arrival rate since the last change point (module docstring)."""
        w = self.tick_s or 1.0
        last = sum(1 for t in self._arrivals if t > now - w)
        prev = sum(1 for t in self._arrivals if now - 2 * w < t <= now - w)
        if abs(last - prev) > 3 * math.sqrt(max(prev, 1)):
            self._rate_since = now - w
        span = max(now - self._rate_since, w)
        n = sum(1 for t in self._arrivals if t > self._rate_since)
        self._arrivals = [t for t in self._arrivals if t > min(self._rate_since, now - 2 * w)]
        return n / span

    def on_tick(self, now: float, view: ClusterView, queued: Mapping[str, int]) -> list[Action]:
        moves = self._rebalance(now, view) if self.rebalancer is not None else []
        return moves + (self._scale(now, view, queued) if self.scaling else [])

    def _scale(self, now: float, view: ClusterView, queued: Mapping[str, int]) -> list[Action]:
        """§5.2 heartbeat scaling (module docstring)."""
        mine = [
            r
            for r in view.replicas()
            if r.group == self.group
            and r.status in (ReplicaStatus.JOINING, ReplicaStatus.LOADING, ReplicaStatus.UP)
        ]
        up = [r for r in mine if r.status is ReplicaStatus.UP]
        held = sum(queued.values())
        rate = self.rate(now)
        target = self.min_workers
        if self.k5 is not None and self.c5 is not None:
            target = max(target, math.ceil(self.k5 * rate + self.c5))
        target = min(target, self.max_workers)
        joining = len(mine) - len(up)
        if ((held and joining == 0) or len(mine) < target) and len(mine) < self.max_workers:
            # Held requests open as many workers as they would fill at the current mean
            # batch (Algorithm 1 opens one bin per misfit; a cold start is paid once).
            per = max(1.0, sum(r.outstanding for r in up) / max(len(up), 1))
            n = max(1, target - len(mine), math.ceil(held / per) if joining == 0 else 0)
            n = min(n, self.max_workers - len(mine))
            self.decisions.append((now, "add", len(mine) + n))
            return [AddReplica(self.group) for _ in range(n)]
        if not held and len(up) > target and joining == 0 and self.placement is not None:
            ws = self.placement.workers
            idle = min(
                up,
                key=lambda r: (
                    len(ws[r.replica_id].requests) if r.replica_id in ws else 0,
                    -r.replica_id,
                ),
            )
            self.decisions.append((now, "remove", len(mine) - 1))
            if idle.replica_id in ws:
                del ws[idle.replica_id]
            return [RemoveReplica(idle.replica_id)]
        return []


def _factory(seed: int, **params: Any) -> AladdinRouter:
    return AladdinRouter(seed, **params)


register_router(
    "aladdin",
    _factory,
    "Aladdin's best-fit placement under its SLO and KV constraints; scaling=true scales",
)

__all__: Sequence[str] = ["AladdinRouter"]
