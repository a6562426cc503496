"""The cluster layer (milestone 1): many replicas on one clock behind a router.

Placeholder docstring; completed below once the API settles.
"""

from sloserve.cluster.cluster import Cluster, ConservationError
from sloserve.cluster.config import ClusterConfig, Drain, Failure, ReplicaGroup
from sloserve.cluster.routing import (
    Hold,
    PipelineRouter,
    Router,
    Scorer,
    make_router,
    register_router,
    router_names,
)
from sloserve.cluster.view import (
    ClusterView,
    ReplicaStatus,
    ReplicaView,
    RouteRequest,
    StaticReplica,
)

__all__ = [
    "Cluster",
    "ClusterConfig",
    "ClusterView",
    "ConservationError",
    "Drain",
    "Failure",
    "Hold",
    "PipelineRouter",
    "ReplicaGroup",
    "ReplicaStatus",
    "ReplicaView",
    "RouteRequest",
    "Router",
    "Scorer",
    "StaticReplica",
    "make_router",
    "register_router",
    "router_names",
]
