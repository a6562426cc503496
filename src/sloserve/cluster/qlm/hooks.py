"""What QLM gets from the simulation beyond the router's view (:class:`QLMHooks`, filled
by ``experiments/cluster_run.py``) and what it reports back (:class:`QLMStats`, the run
summary's ``qlm`` block)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sloserve.cluster.qlm.rct import HardwareProfile, r_squared
from sloserve.core.request import Request


@dataclass
class QLMHooks:
    """What the simulation gives QLM beyond the :class:`ClusterView` (``cluster_run``):
    ``request`` (a submitted request by id: its routing facts at arrival, its output
    length once it ended), ``profile`` (the RCT constants of a replica, by replica id)
    and ``swap_s`` (seconds to load a model onto a replica, cold)."""

    request: Callable[[int | str], Request | None]
    profile: Callable[[int], HardwareProfile]
    swap_s: Callable[[int, str], float]
    set_warm: Callable[[int, set[str]], None] = lambda rid, models: None
    """Which models replica ``rid`` keeps in CPU memory (loads of them are warm)."""
    weight_bytes: Callable[[str], float | None] | None = None
    """A model's checkpoint bytes as the cluster's registry knows them (``None``: the
    router reads the spec catalog)."""
    disk_gb_per_s: float | None = None
    """The cluster's checkpoint read rate (``cluster.transfer.disk_gb_per_s``): the rate
    of the reads into CPU memory too, unless ``router_params.disk_gb_per_s`` sets one."""


@dataclass
class QLMStats:
    """What the plan generator did (the run's ``qlm`` summary block)."""

    plan_calls: int = 0
    methods: dict[str, int] = field(default_factory=dict)
    fallbacks: int = 0
    solve_s_total: float = 0.0
    solve_s_max: float = 0.0
    infeasible_plans: int = 0
    model_changes: int = 0
    flushes: int = 0
    """Model changes that gave the replica's requests back (``swap: flush``)."""
    flushed_requests: int = 0
    flush_drains: int = 0
    """Changes under ``swap: flush`` that drained instead: the replica had finished nothing
    since its last change (``flush.py``'s progress rule)."""
    kept_incumbent: int = 0
    """Plans not adopted: the virtual queues in force scored at least as well."""
    predicted: list[float] = field(default_factory=list)
    actual: list[float] = field(default_factory=list)
    wait_pred: dict[int | str, float] = field(default_factory=dict)
    """Predicted start (absolute) of each request that opened a group, at its placement."""
    wait_samples: list[tuple[float, float]] = field(default_factory=list)
    """(predicted, simulated) waiting time of those requests: arrival to first scheduled."""

    def waited(self, req_id: int | str, r: Request) -> None:
        """Record a finished request's waiting time beside the prediction (if it had one)."""
        pred = self.wait_pred.pop(req_id, None)
        if pred is not None and r.first_scheduled is not None:
            self.wait_samples.append((pred - r.arrival, r.first_scheduled - r.arrival))

    def as_dict(self) -> dict[str, Any]:
        return {
            "plan_calls": self.plan_calls,
            "plan_methods": dict(sorted(self.methods.items())),
            "plan_fallbacks": self.fallbacks,
            "plan_solve_s_total": self.solve_s_total,
            "plan_solve_s_max": self.solve_s_max,
            "plans_predicting_violations": self.infeasible_plans,
            "model_changes": self.model_changes,
            "plans_kept_incumbent": self.kept_incumbent,
            "flushes": self.flushes,
            "flushed_requests": self.flushed_requests,
            "flush_drains": self.flush_drains,
            "rct_r2": r_squared(self.predicted, self.actual),
            "rct_samples": len(self.actual),
            "rct_wait_r2": r_squared(
                [p for p, _ in self.wait_samples], [a for _, a in self.wait_samples]
            ),
            "rct_wait_samples": len(self.wait_samples),
        }
