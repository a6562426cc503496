"""The emulated backend's configuration: :class:`EmulatedConfig`.

What :class:`~sloserve.serve.emulated.EmulatedBackend` runs (the replicas, their policy
and router, the clock's scale, admission) as one frozen, validated model; the module
docstring of :mod:`sloserve.serve.emulated` explains each choice. The local backend
(:mod:`sloserve.serve.local`) takes the same configuration for its one replica.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloserve.cluster.config import ClusterConfig, ReplicaGroup
from sloserve.core.bounds import Seed
from sloserve.experiments.runner import InstanceConfig
from sloserve.workloads.lengths import LengthDist


class EmulatedConfig(BaseModel):
    """The emulated backend: a cluster of engine replicas (``replicas`` identical ones of
    ``instance`` and ``policy`` behind ``router``, or the groups of ``cluster``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance: InstanceConfig = Field(
        default_factory=InstanceConfig,
        description="profile and limits of each replica (multi_step is always off live)",
    )
    policy: str = Field(default="vllm", description="per-instance policy (sloserve policies)")
    policy_params: dict[str, Any] = Field(default_factory=dict)
    replicas: int = Field(default=1, ge=1, le=64)
    router: str = Field(default="least-loaded", description="see sloserve.cluster.routing")
    router_params: dict[str, Any] = Field(default_factory=dict)
    cluster: ClusterConfig | None = Field(
        default=None,
        description="replica groups, router, failures and drains (a YAML cluster: section); "
        "its groups' unset fields take instance/policy; excludes replicas/router",
    )
    time_scale: float = Field(
        default=1.0, gt=0, le=1000, description="simulated seconds per wall second"
    )
    output_length: LengthDist | None = Field(
        default=None, description="output-length distribution (else max_tokens)"
    )
    seed: Seed = 0
    max_queue: int | None = Field(
        default=None, ge=1, description="waiting requests per replica before 429"
    )
    retry_after_s: float = Field(default=1.0, gt=0, description="Retry-After on a full queue")
    admission: Literal["none", "queue", "slo"] = Field(
        default="queue",
        description="'none' never answers 429; 'queue' when max_queue is reached; 'slo' also "
        "to a real-time request whose TTFT target or deadline can no longer be met",
    )
    served_model_name: str | None = Field(
        default=None, description="the model name clients use (default: the profile's model)"
    )

    @model_validator(mode="after")
    def _admission(self) -> EmulatedConfig:
        if self.admission == "none" and self.max_queue is not None:
            raise ValueError("max_queue needs admission 'queue' or 'slo', not 'none'")
        both = {"replicas", "router", "router_params"} & self.model_fields_set
        if self.cluster is not None and both:
            raise ValueError(
                f"{', '.join(sorted(both))} and cluster both given: set them in cluster"
            )
        return self

    def cluster_config(self) -> ClusterConfig:
        """The cluster the backend runs: ``cluster``, or ``replicas`` behind ``router``."""
        if self.cluster is not None:
            return self.cluster
        return ClusterConfig(
            replicas=[ReplicaGroup(count=self.replicas)],
            router=self.router,
            router_params=self.router_params,
        )
