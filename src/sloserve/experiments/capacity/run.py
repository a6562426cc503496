"""``plan_capacity``: the capacity planner's Python entry point (``sloserve.plan_capacity``;
the CLI's ``sloserve capacity`` calls it).

It takes the inputs the way a user has them (a workload or run config as a mapping or a
YAML path, SLOs as text or :class:`~.slo.Target` tuples, lists of names), checks them all
before anything runs (one-line :class:`~sloserve.core.errors.ConfigError` naming the field
and value), runs the question asked, and writes the output folder when ``out`` is given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.experiments.capacity.planner import (
    SCREEN_FRACTION,
    CapacityResult,
    fewest_gpus,
    highest_rate,
)
from sloserve.experiments.capacity.slo import Target, check_attainment, check_reachable, parse_slo
from sloserve.experiments.capacity.space import (
    Layout,
    arms,
    check_rates,
    native_rate,
    parse_layout,
    parse_rates,
)
from sloserve.experiments.executor import Executor

RunLike = Mapping[str, Any] | str | Path


def load_base(
    source: RunLike, where: str = "--workload"
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A run config mapping (without ``cluster``) and its ``cluster:`` section, from a run
    config (with a ``workload:`` key) or a bare workload spec, as a mapping or YAML path."""
    from sloserve.config import read_yaml

    data = read_yaml(source) if isinstance(source, (str, Path)) else json.loads(json.dumps(source))
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping")
    run_keys = {"workload", "instance", "policy", "policy_params", "cluster", "horizon_s"}
    if not set(data) & run_keys:
        data = {"workload": data}  # a bare workload spec
    cluster = data.pop("cluster", None)
    data.pop("policies", None)
    data.pop("routers", None)
    if cluster is not None and not isinstance(cluster, dict):
        raise ConfigError(f"{where}: cluster: expected a mapping")
    return data, cluster


def _validate_base(base: Mapping[str, Any], where: str) -> Any:
    from sloserve.config import validate
    from sloserve.experiments.runner import SimConfig

    src = str(where)
    return validate(SimConfig, dict(base), src)


def _targets(slo: str | Sequence[Target] | None) -> tuple[Target, ...]:
    if slo is None:
        return ()
    return parse_slo(slo) if isinstance(slo, str) else tuple(slo)


def _names(v: str | Sequence[str] | None, default: Sequence[str]) -> list[str]:
    if v is None:
        return list(default)
    items = v.split(",") if isinstance(v, str) else list(v)
    return [s.strip() for s in items if s.strip()]


def plan_capacity(
    workload: RunLike,
    *,
    slo: str | Sequence[Target] | None = None,
    attainment: float = 0.99,
    profiles: str | Sequence[str] | None = None,
    routers: str | Sequence[str] | None = None,
    policies: str | Sequence[str] | None = None,
    layouts: str | Sequence[str | Layout] | None = None,
    rates: str | Sequence[float] | None = None,
    max_rate: bool = False,
    seeds: Sequence[int] = (0, 1, 2),
    max_replicas: int = 32,
    prices: Mapping[str, float] | None = None,
    router_params: Mapping[str, Mapping[str, Any]] | None = None,
    tolerance: float = 0.05,
    early_stop: bool = True,
    screen: float | None = SCREEN_FRACTION,
    executor: Executor | str | None = None,
    workers: int | None = None,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> CapacityResult:
    """Plan capacity from simulated traffic (docs: *Capacity planning*).

    Without ``max_rate``: for each rate of ``rates`` (``"2:20:2"`` or a list) and each
    combination of ``profiles`` × ``routers`` × ``policies`` × ``layouts``, the fewest
    replicas (GPUs = replicas × TP) meeting ``slo`` (``"ttft_p90=2s,tpot_p90=100ms"``;
    None: the workload's own per-class SLOs) at ``attainment`` on every seed. With
    ``max_rate``: the highest rate the config's fixed ``cluster:`` sustains under each
    router × policy. ``out``: write the folder (tables, plots, explanation, deployment).
    ``screen``: search a first share of a window of >= 240 s first, then verify on the
    whole window starting at that answer (only whole-window runs decide; None: off).

    >>> import sloserve
    >>> res = sloserve.plan_capacity(
    ...     {"arrival": {"kind": "constant", "rate": 1}, "duration_s": 10, "mix": "sharegpt"},
    ...     slo="ttft=2s", attainment=0.9, rates=[1.0], seeds=[0], workers=1)
    >>> int(res.answers.at[0, "replicas"])
    1
    """
    att = check_attainment(attainment)
    targets = _targets(slo)
    if not seeds:
        raise ConfigError("--seeds: give at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: {list(seeds)} repeats a seed")
    base, cluster = load_base(workload)
    cfg = _validate_base(base, str(workload) if isinstance(workload, (str, Path)) else "config")
    pol_default = [cfg.policy]
    if max_rate:
        if cluster is None:
            raise ConfigError(
                "--max-rate: the config has no 'cluster:' section (the fixed cluster to test)"
            )
        from sloserve.cluster.config import ClusterConfig

        ccfg = ClusterConfig.load(cluster, "config: cluster")
        rts = _names(routers, [ccfg.router])
        pols = _names(policies, pol_default)
        profs = [g.profile or cfg.instance.profile for g in ccfg.replicas]
        _check_reachable(base, targets, profs)
        res = highest_rate(
            base,
            cluster,
            rts,
            pols,
            targets,
            att,
            seeds=seeds,
            tolerance=tolerance,
            early_stop=early_stop,
            executor=executor,
            workers=workers,
            progress=progress,
        )
        if out is not None:
            from sloserve.experiments.capacity.output import write

            write(res, out, base, fixed_cluster=cluster)
        return res
    profs = _names(profiles, [cfg.instance.profile])
    rts = _names(routers, ["least-loaded"])
    pols = _names(policies, pol_default)
    if isinstance(layouts, str):
        lays = [parse_layout(x) for x in layouts.split(",") if x.strip()]
    else:
        lays = [x if isinstance(x, Layout) else parse_layout(x) for x in (layouts or ["agg"])]
    if rates is None:
        arr = base.get("workload", {}).get("arrival", {})
        rate_list = check_rates([float(arr.get("rate", 4.0))])
    elif isinstance(rates, str):
        rate_list = parse_rates(rates)
    else:
        rate_list = check_rates([float(r) for r in rates])
    space = arms(profs, rts, pols, lays)
    rparams = {k: dict(v) for k, v in (router_params or {}).items()}
    _check_names(space, rparams)
    if "aladdin" in rts:
        # Aladdin packs by the SLOs it is given: give it the targets being planned for
        slo_of = {t.metric: t.threshold_s for t in targets}
        own = rparams.setdefault("aladdin", {})
        if "ttft" in slo_of:
            own.setdefault("slo_ttft_ms", slo_of["ttft"] * 1e3)
        if "tpot" in slo_of:
            own.setdefault("slo_atgt_ms", slo_of["tpot"] * 1e3)
    _check_reachable(base, targets, profs)
    res = fewest_gpus(
        base,
        space,
        rate_list,
        targets,
        att,
        seeds=seeds,
        max_replicas=max_replicas,
        prices=prices,
        router_params=rparams,
        early_stop=early_stop,
        screen=screen,
        executor=executor,
        workers=workers,
        progress=progress,
    )
    if out is not None:
        from sloserve.experiments.capacity.output import write

        write(res, out, base)
    return res


def _check_names(space: Sequence[Any], params: Mapping[str, Mapping[str, Any]]) -> None:
    """Unknown routers, router parameters and policies are errors before anything runs."""
    from sloserve.cluster.routing import check_router, make_router
    from sloserve.policies.registry import make_policy

    routers = list(dict.fromkeys(a.router for a in space))
    for r in routers:
        try:
            check_router(r, {})
        except ConfigError as e:
            raise ConfigError(f"--routers: {e}") from None
        try:
            check_router(r, params.get(r, {}))
            # a factory taking **params (Aladdin's) checks its names only when it builds
            make_router(r, params.get(r, {}))
        except ConfigError as e:
            raise ConfigError(f"--router-params: {e}") from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"--router-params: router {r!r}: {e}") from None
    extra = sorted(set(params) - set(routers))
    if extra:
        raise ConfigError(f"--router-params: {extra[0]!r} is not one of the searched routers")
    for p in dict.fromkeys(a.policy for a in space):
        try:
            make_policy(p, {})
        except ConfigError as e:
            raise ConfigError(f"--policies: {e}") from None


def _check_reachable(
    base: Mapping[str, Any], targets: Sequence[Target], profiles: Sequence[str]
) -> None:
    """Build the workload once (at its own rate) and check no target is out of reach."""
    if not targets:
        return
    from sloserve.experiments.capacity.space import with_rate
    from sloserve.experiments.runner import workload_of

    native = native_rate(base)
    data = with_rate(base, native, native) if native is not None else dict(base)
    cfg = _validate_base(data, "workload")
    for p in profiles:
        from sloserve.costmodel.profile import load_profile

        for name in p.split("+"):
            try:
                load_profile(name)
            except ConfigError as e:
                raise ConfigError(f"--profiles: {e}") from None
    check_reachable(targets, profiles, workload_of(cfg).requests)
