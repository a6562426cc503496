"""The cluster's configuration: replica groups, the router, scheduled drains and failures.

Frozen pydantic models (unknown keys are errors). Structural checks (counts, signs) are
pydantic's; :meth:`ClusterConfig.check` does the ones that need the run around it (names
of routers, profiles and policies, event times against the horizon, replica indices) and
raises a one-line :class:`~sloserve.core.errors.ConfigError` naming the field and value.

Choices: replicas are numbered 0.. in group order (group 0's replicas first); a group's
unset fields (``profile``, ``policy``, ``policy_params``, the instance limits) take the
run's values, so ``ClusterConfig()`` is one replica exactly like the single-replica run.
A replica's model is its profile's model name unless the group sets ``model``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sloserve.cluster.admission import AdmissionConfig
from sloserve.cluster.controller import AutoscalerConfig
from sloserve.cluster.models import ModelOverride, TransferConfig
from sloserve.cluster.routing import check_router
from sloserve.config import validate
from sloserve.core.bounds import MAX_COUNT, MAX_GIB, MAX_SECONDS, MAX_TOKENS, ReplicaCount
from sloserve.core.errors import ConfigError
from sloserve.costmodel.profile import ReplicaProfile, load_profile
from sloserve.policies.registry import make_policy


class ReplicaGroup(BaseModel):
    """``count`` identical replicas."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    count: ReplicaCount = Field(default=1, description="number of replicas in the group")
    profile: str | None = Field(
        default=None, description="hardware profile (name or YAML path); unset: the run's"
    )
    policy: str | None = Field(default=None, description="per-replica scheduler; unset: the run's")
    policy_params: dict[str, Any] | None = Field(
        default=None, description="the policy's parameters; unset: the run's"
    )
    start_s: float = Field(
        default=0.0,
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="when the replicas join the cluster",
    )
    model: str | None = Field(
        default=None, description="model served (routing key); unset: the profile's model name"
    )
    max_running: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="R_max override")
    max_batch_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="C override"
    )
    chunk_size: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="P override")
    block_size: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="KV block size override"
    )
    kv_utilization: float | None = Field(
        default=None, gt=0, le=1, allow_inf_nan=False, description="GPU memory fraction override"
    )
    kv_capacity_tokens: int | None = Field(
        default=None, ge=1, le=50_000_000, description="M override, in tokens"
    )
    cpu_swap_gib: float | None = Field(
        default=None, ge=0, le=MAX_GIB, allow_inf_nan=False, description="CPU swap tier override"
    )
    gpu_hour_usd: float | None = Field(
        default=None,
        ge=0,
        le=1e4,
        allow_inf_nan=False,
        description="price of one GPU-hour of this group's GPU kind (for the run's cost)",
    )
    role: Literal["both", "prefill", "decode"] = Field(
        default="both", description="disaggregated serving: prefill or decode replicas"
    )

    def instance_overrides(self) -> dict[str, Any]:
        """The instance fields this group sets (the rest come from the run)."""
        keys = (
            "profile",
            "max_running",
            "max_batch_tokens",
            "chunk_size",
            "block_size",
            "kv_utilization",
            "kv_capacity_tokens",
            "cpu_swap_gib",
        )
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class Failure(BaseModel):
    """Replica ``replica`` fails at ``at_s``; it recovers (empty) at ``recover_s`` if set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replica: int = Field(ge=0, le=MAX_COUNT, description="replica index (0.., in group order)")
    at_s: float = Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False, description="failure time")
    recover_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="recovery time (> at_s); unset: never",
    )


class Drain(BaseModel):
    """Replica ``replica`` stops accepting at ``at_s`` and leaves once it is empty."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replica: int = Field(ge=0, le=MAX_COUNT, description="replica index (0.., in group order)")
    at_s: float = Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False, description="drain time")


class ModelSwap(BaseModel):
    """Replica ``replica`` changes to ``model`` at ``at_s`` (after finishing what it holds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replica: int = Field(ge=0, description="replica index (0.., in group order)")
    at_s: float = Field(ge=0, description="when it stops accepting its current model")
    model: str = Field(description="the model it loads")


class ClusterConfig(BaseModel):
    """Several replicas on one clock behind a router."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replicas: list[ReplicaGroup] = Field(
        default_factory=lambda: [ReplicaGroup()], min_length=1, description="replica groups"
    )
    router: str = Field(default="pass-through", description="router name (see routers)")
    router_params: dict[str, Any] = Field(
        default_factory=dict, description="the router's parameters (seed: the workload's)"
    )
    failures: list[Failure] = Field(default_factory=list, description="scheduled failures")
    drains: list[Drain] = Field(default_factory=list, description="scheduled drains")
    model_swaps: list[ModelSwap] = Field(
        default_factory=list, description="scheduled model changes"
    )
    models: dict[str, ModelOverride] = Field(
        default_factory=dict, description="model registry overrides (weights_gib, ...)"
    )
    transfer: TransferConfig = Field(
        default_factory=TransferConfig, description="load and KV-transfer bandwidths"
    )
    cold_start: bool = Field(
        default=True,
        description="a replica joining after t=0 (or added) loads its model from disk first",
    )
    admission: AdmissionConfig = Field(
        default_factory=AdmissionConfig, description="admission before routing"
    )
    autoscaler: AutoscalerConfig | None = Field(
        default=None, description="the utilisation-threshold autoscaler"
    )
    trace_decisions: bool = Field(
        default=False, description="record every routing decision (result.decisions)"
    )

    @classmethod
    def load(cls, data: Mapping[str, Any], source: str = "cluster") -> ClusterConfig:
        """Validate a mapping (a YAML ``cluster:`` section); one-line ConfigError."""
        cfg: ClusterConfig = validate(cls, data, source)
        return cfg

    @property
    def num_replicas(self) -> int:
        return sum(g.count for g in self.replicas)

    @property
    def disaggregated(self) -> bool:
        return any(g.role != "both" for g in self.replicas)

    def group_of(self) -> list[int]:
        """Group index of each replica, by replica index."""
        return [gi for gi, g in enumerate(self.replicas) for _ in range(g.count)]

    def check(
        self,
        *,
        horizon_s: float | None,
        profile: str,
        policy: str,
        load: Callable[[str], ReplicaProfile] = load_profile,
    ) -> None:
        """Names and times against the run (``profile``/``policy``: the run's defaults;
        ``load`` reads a profile: a run passes its own cached reader, one read per run)."""
        check_router(self.router, self.router_params)
        for gi, g in enumerate(self.replicas):
            where = f"cluster.replicas.{gi}"
            prof = g.profile or profile
            try:
                load(prof)
            except ConfigError as e:
                raise ConfigError(f"{where}.profile: {e}") from None
            pol = g.policy or policy
            try:
                make_policy(pol, g.policy_params or {})
            except ConfigError as e:
                raise ConfigError(f"{where}.policy: {e}") from None
            if horizon_s is not None and g.start_s >= horizon_s:
                raise ConfigError(f"{where}.start_s: {g.start_s} is not before the horizon")
        n = self.num_replicas
        groups = self.group_of()
        end = math.inf if horizon_s is None else horizon_s
        events: list[tuple[str, int, float]] = [
            *((f"failures.{i}", f.replica, f.at_s) for i, f in enumerate(self.failures)),
            *((f"drains.{i}", d.replica, d.at_s) for i, d in enumerate(self.drains)),
            *((f"model_swaps.{i}", w.replica, w.at_s) for i, w in enumerate(self.model_swaps)),
        ]
        for where, rep, at in events:
            if rep >= n:
                raise ConfigError(
                    f"cluster.{where}.replica: {rep} out of range (replicas 0..{n - 1})"
                )
            start = self.replicas[groups[rep]].start_s
            if not start <= at < end:
                raise ConfigError(
                    f"cluster.{where}.at_s: {at} outside the run "
                    f"(replica {rep} joins at {start}, horizon {end})"
                )
        if self.disaggregated:
            roles = {g.role for g in self.replicas}
            if roles != {"prefill", "decode"}:
                raise ConfigError(
                    "cluster.replicas: disaggregated serving needs prefill and decode groups "
                    f"and no 'both' (roles: {', '.join(sorted(roles))})"
                )
            if self.model_swaps or self.autoscaler is not None:
                raise ConfigError(
                    "cluster: model_swaps and autoscaler are not supported with "
                    "prefill/decode roles"
                )
        a = self.autoscaler
        if a is not None:
            if a.group >= len(self.replicas):
                raise ConfigError(
                    f"cluster.autoscaler.group: {a.group} out of range "
                    f"(groups 0..{len(self.replicas) - 1})"
                )
            c = self.replicas[a.group].count
            if not a.min <= c <= a.max:
                raise ConfigError(
                    f"cluster.autoscaler: group {a.group} starts with {c} replicas, "
                    f"outside min {a.min}..max {a.max}"
                )
        for i, f in enumerate(self.failures):
            if f.recover_s is not None and not f.at_s < f.recover_s:
                raise ConfigError(
                    f"cluster.failures.{i}.recover_s: {f.recover_s} is not after at_s {f.at_s}"
                )
