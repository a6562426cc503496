"""The top-level entry points: :func:`simulate` and :func:`compare` on any form of config.

These are what ``sloserve.simulate`` and ``sloserve.compare`` are. They accept the config
the way a user has it — a :class:`~sloserve.experiments.runner.SimConfig`, a plain mapping
(as read from YAML or written inline), or the path of a YAML file — validate it once with
one-line errors, and hand it to the runner. The runner's own ``simulate`` / ``compare`` take
only a validated ``SimConfig`` and are internal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sloserve.cluster.config import ClusterConfig
from sloserve.config import read_yaml, validate
from sloserve.core.request import Request
from sloserve.experiments import runner
from sloserve.experiments.runner import RunResult, SimConfig
from sloserve.workloads.spec import Workload

ConfigLike = SimConfig | Mapping[str, Any] | str | Path
"""A run config: a ``SimConfig``, a mapping of its fields, or the path of a YAML file."""


def load_config(config: ConfigLike, **overrides: Any) -> SimConfig:
    """Turn any :data:`ConfigLike` into a validated, frozen :class:`SimConfig`.

    ``overrides`` replace top-level fields (``policy="sarathi"``, ``horizon_s=60``). A bad
    value raises :class:`~sloserve.core.errors.ConfigError` naming the field and the value.
    A ``cluster:`` section is not part of a ``SimConfig``: see :func:`load_run`.

    >>> load_config({"policy": "sarathi", "workload": {"duration_s": 10}}).policy
    'sarathi'
    """
    return load_run(config, **overrides)[0]


def load_run(config: ConfigLike, **overrides: Any) -> tuple[SimConfig, ClusterConfig | None]:
    """The run's :class:`SimConfig` and, when the config has a ``cluster:`` section (or a
    ``cluster=`` override: a mapping or a :class:`ClusterConfig`), its cluster."""
    if isinstance(config, SimConfig):
        data: dict[str, Any] = config.model_dump(exclude_unset=True)
        source = "config"
    elif isinstance(config, (str, Path)):
        data = read_yaml(config)
        source = str(config)
    elif isinstance(config, Mapping):
        data = dict(config)
        source = "config"
    else:
        from sloserve.core.errors import ConfigError

        raise ConfigError(
            f"config: expected a SimConfig, a mapping or a YAML path, not {type(config).__name__}"
        )
    data.update(overrides)
    cluster = data.pop("cluster", None)
    cfg: SimConfig = validate(SimConfig, data, source)
    if cluster is None or isinstance(cluster, ClusterConfig):
        return cfg, cluster
    if not isinstance(cluster, Mapping):
        from sloserve.core.errors import ConfigError

        raise ConfigError(f"{source}: cluster: expected a mapping, not {type(cluster).__name__}")
    return cfg, ClusterConfig.load(cluster, f"{source}: cluster")


def simulate(
    config: ConfigLike | None = None,
    requests: Sequence[Request] | Workload | None = None,
    *,
    check_invariants: bool = False,
    **overrides: Any,
) -> RunResult:
    """Simulate one policy on one replica — or a cluster, when the config has a ``cluster``
    section — and return its :class:`RunResult`.

    ``config`` defaults to the built-in defaults (vLLM on Llama-2-7B / A100, ShareGPT
    lengths, Poisson arrivals); ``overrides`` replace top-level config fields. ``requests``
    replays those requests instead of building the config's workload. The same config and
    seed give the same result. A cluster run's table and trace gain a ``replica`` column
    and its summary per-replica rows (``replicas``) and ``gpu_seconds``.

    >>> cfg = {"workload": {"arrival": {"kind": "poisson", "rate": 2}, "duration_s": 10}}
    >>> r = simulate(cfg, policy="sarathi")
    >>> r.summary["policy"], r.summary["finished"] == len(r.table)
    ('sarathi', True)
    >>> c = simulate(cfg, cluster={"replicas": [{"count": 2}], "router": "least-loaded"})
    >>> sorted(set(c.table["replica"]))
    [0, 1]
    """
    cfg, cluster = load_run(config if config is not None else {}, **overrides)
    if cluster is None:
        return runner.simulate(cfg, requests, check_invariants=check_invariants)
    from sloserve.experiments.cluster_run import simulate_cluster

    return simulate_cluster(cfg, cluster, requests, check_invariants=check_invariants)


def compare(
    config: ConfigLike | None = None,
    policies: Sequence[str] = ("vllm", "sarathi"),
    **overrides: Any,
) -> dict[str, RunResult]:
    """Run each policy on the very same requests (on one replica, or on the config's
    cluster); returns ``{policy: RunResult}``.

    ``policy_params`` in the config apply to every policy; a policy named twice, an unknown
    policy or a bad parameter is a :class:`~sloserve.core.errors.ConfigError` raised before
    anything runs.

    >>> cfg = {"workload": {"arrival": {"kind": "poisson", "rate": 2}, "duration_s": 10}}
    >>> res = compare(cfg, ["vllm", "sarathi"])
    >>> sorted(res)
    ['sarathi', 'vllm']
    """
    cfg, cluster = load_run(config if config is not None else {}, **overrides)
    if cluster is None:
        return runner.compare(cfg, list(policies))
    from sloserve.experiments.cluster_run import simulate_cluster

    runner.check_policies(cfg, policies)
    workload = runner.workload_of(cfg)
    return {
        p: simulate_cluster(cfg.model_copy(update={"policy": p}), cluster, workload)
        for p in policies
    }
