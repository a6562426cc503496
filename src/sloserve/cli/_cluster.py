"""The cluster options shared by simulate, compare and serve, and the run's ClusterConfig
from a YAML ``cluster:`` section plus ``--replicas`` / ``--router`` (:func:`_cluster_config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._bounded import bounded
from sloserve.config import read_yaml
from sloserve.core.bounds import ReplicaCount
from sloserve.core.errors import SloserveError

ReplicasOpt = Annotated[
    int | None,
    bounded(
        ReplicaCount,
        "--replicas",
        help="Simulate a cluster of this many replicas of the run's profile and policy "
        "(or the YAML's cluster.replicas with one group: its count).",
    ),
]
TraceDecisionsOpt = Annotated[
    bool,
    typer.Option(
        "--trace-decisions",
        help="Record every routing decision (a cluster run): decisions.parquet in --out.",
    ),
]

RouterOpt = Annotated[
    str | None,
    typer.Option(
        "--router",
        help="Cluster router (see `sloserve routers`); default round-robin, pass-through "
        "for one replica.",
    ),
]


def _cluster_config(
    config: Path | None,
    replicas: int | None,
    router: str | None,
    *,
    single: bool = False,
    trace_decisions: bool = False,
) -> tuple[Any, list[str] | None]:
    """The run's ClusterConfig (None: a single replica, today's path) and the YAML's
    ``routers:`` list, from the YAML's ``cluster:`` section and the flags. ``single``: the
    command runs one router, so a ``routers:`` list needs ``cluster.router`` or --router."""
    data = read_yaml(config) if config is not None else {}
    source = str(config) if config is not None else "command line"
    section = data.get("cluster")
    routers = data.get("routers")
    if routers is not None and (
        not isinstance(routers, list) or not all(isinstance(r, str) for r in routers)
    ):
        raise SloserveError(f"{source}: 'routers' must be a list of router names")
    if (
        section is None
        and replicas is None
        and router is None
        and routers is None
        and not trace_decisions
    ):
        return None, None
    # Imported here: a single-replica run does not load the cluster layer (start-up time).
    from sloserve.cluster.config import ClusterConfig

    if section is not None and not isinstance(section, dict):
        raise SloserveError(f"{source}: 'cluster' must be a mapping")
    if single and routers is not None and router is None and "router" not in (section or {}):
        raise SloserveError(
            f"{source}: 'routers' lists several routers and 'cluster.router' names none; "
            "use `sloserve compare`, or pick one with --router"
        )
    cluster: dict[str, Any] = dict(section or {})
    if replicas is not None:
        groups = cluster.get("replicas")
        if isinstance(groups, list) and len(groups) > 1:
            raise SloserveError(
                f"--replicas: {source} has {len(groups)} replica groups; set each group's "
                "count in the YAML instead"
            )
        group = dict(groups[0]) if isinstance(groups, list) and groups else {}
        group["count"] = replicas
        cluster["replicas"] = [group]
    if trace_decisions:
        cluster["trace_decisions"] = True
    if router is not None:
        cluster["router"] = router
    elif "router" not in cluster:
        groups = cluster.get("replicas") or [{}]
        one = (
            isinstance(groups, list)
            and len(groups) == 1
            and isinstance(groups[0], dict)
            and groups[0].get("count", 1) == 1
        )
        cluster["router"] = "pass-through" if one else "round-robin"
    src = f"{source}: cluster" if section is not None else "cluster"
    return ClusterConfig.load(cluster, src), routers
