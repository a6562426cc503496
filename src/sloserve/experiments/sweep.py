"""Sweeps: a grid of simulated runs, one parquet of summaries, a Pareto plot, resumable.

A sweep file (YAML)::

    base:                 # a run config, as `sloserve simulate --config` takes it
      workload: {mix: sharegpt, duration_s: 5}
      instance: {profile: llama-2-7b-a100}
      cluster: {router: round-robin, replicas: [{count: 2}]}   # optional: a cluster run
    grid:                 # dotted config paths -> values; the cartesian product is run
      policy: [vllm, sarathi]
      workload.arrival.rate: [2, 4, 8]
      cluster.replicas.0.count: [2, 4]      # list items by index
    points:               # optional: explicit points (each crossed with the grid)
      - {instance.max_running: 64}
      - {instance.max_running: 256}

``policies: [...]`` in ``base`` is read as ``grid: {policy: [...]}`` (what ``compare``
takes). Points are checked before anything runs (a bad value names the point and field).
A point with a ``cluster:`` section runs through
:func:`~sloserve.experiments.cluster_run.simulate_cluster`, the others through
:func:`~sloserve.experiments.runner.simulate`.

Output folder: ``points.jsonl`` gets one line per finished point as it finishes (keyed by
a hash of the point's full, validated config, so equal configs are one point), and a rerun
skips every point already there: a killed sweep resumes. ``summary.parquet`` has one row
per point in grid order: ``point``, ``key``, the parameters (dotted names), and the
flattened summary metrics (nested ones dotted, lists as JSON; a metric whose name is also a
parameter is ``result.<name>``), plus ``replicas`` and, for single replicas,
``gpu_seconds`` (= simulated seconds), so that cost can be an axis. ``pareto.png`` plots
two metrics with the Pareto front (:mod:`.pareto`); ``pareto_front`` marks its points.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sloserve.cluster.config import ClusterConfig
from sloserve.config import read_yaml, validate
from sloserve.core.errors import ConfigError
from sloserve.experiments.executor import Executor, as_executor
from sloserve.experiments.pareto import DEFAULT_AXES, pareto_mask, parse_axes, plot_pareto
from sloserve.experiments.runner import SimConfig
from sloserve.policies.registry import make_policy

POINTS_FILE = "points.jsonl"
SUMMARY_FILE = "summary.parquet"
PLOT_FILE = "pareto.png"


def _index(key: str) -> int | None:
    return int(key) if key.isdigit() else None


def set_dotted(data: dict[str, Any], path: str, value: Any, where: str) -> None:
    """``data[a][b]... = value`` for ``path`` ``a.b...``; digits index lists (an index one
    past the end appends a new mapping), missing mappings are created."""
    keys = path.split(".")
    if not path or any(not k for k in keys):
        raise ConfigError(f"{where}: {path!r} is not a dotted config path")
    node: Any = data
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        i = _index(key)
        if isinstance(node, list):
            if i is None or i > len(node):
                raise ConfigError(
                    f"{where}: {path}: no item {key!r} in {'.'.join(keys[:depth])} "
                    f"(it has {len(node)})"
                )
            if i == len(node):
                node.append({})
            if last:
                node[i] = value
            else:
                if not isinstance(node[i], (dict, list)):
                    node[i] = {}
                node = node[i]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {path}: {'.'.join(keys[:depth])} is not a mapping")
        if last:
            node[key] = value
            return
        nxt = node.get(key)
        if not isinstance(nxt, (dict, list)):
            # replicas.0.count: a list where the next key is an index
            nxt = [] if _index(keys[depth + 1]) is not None else {}
            node[key] = nxt
        node = nxt


def _copy(x: Any) -> Any:
    return json.loads(json.dumps(x))


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its parameters, its validated config and its key."""

    index: int
    params: dict[str, Any]
    config: SimConfig
    cluster: ClusterConfig | None
    key: str

    @property
    def task(self) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
        """What a worker needs (plain data: any executor can ship it)."""
        cl = None if self.cluster is None else self.cluster.model_dump(mode="json")
        return self.key, self.config.model_dump(mode="json"), cl


def point_key(config: SimConfig, cluster: ClusterConfig | None) -> str:
    """A stable hash of a point's full config (defaults included, keys sorted)."""
    blob = {
        "config": config.model_dump(mode="json"),
        "cluster": None if cluster is None else cluster.model_dump(mode="json"),
    }
    text = json.dumps(blob, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class SweepSpec:
    """A sweep: the base run config, the grid and the explicit points."""

    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)
    source: str = "sweep"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "sweep") -> SweepSpec:
        unknown = sorted(set(data) - {"base", "grid", "points"})
        if unknown:
            raise ConfigError(f"{source}: unknown key {unknown[0]!r} (valid: base, grid, points)")
        base = data.get("base") or {}
        grid = data.get("grid") or {}
        points = data.get("points") or []
        if not isinstance(base, dict):
            raise ConfigError(f"{source}: base: expected a mapping (a run config)")
        if not isinstance(grid, dict):
            raise ConfigError(f"{source}: grid: expected a mapping of config paths to lists")
        base = _copy(base)
        grid = dict(grid)
        if "policies" in base:
            pols = base.pop("policies")
            if "policy" in grid:
                raise ConfigError(f"{source}: base.policies and grid.policy both given")
            grid = {"policy": pols, **grid}
        for path, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{source}: grid.{path}: expected a non-empty list of values")
        if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
            raise ConfigError(f"{source}: points: expected a list of mappings")
        return cls(base, {str(k): list(v) for k, v in grid.items()}, _copy(points), source)

    @classmethod
    def load(cls, path: str | Path) -> SweepSpec:
        return cls.from_mapping(read_yaml(path), str(path))

    def combos(self) -> list[dict[str, Any]]:
        """The parameters of every point: explicit points × the grid's product."""
        names = list(self.grid)
        product = [
            dict(zip(names, vals, strict=True))
            for vals in itertools.product(*(self.grid[n] for n in names))
        ]
        explicit = [{str(k): v for k, v in p.items()} for p in self.points] or [{}]
        return [{**p, **g} for p in explicit for g in product]

    def expand(self) -> list[Point]:
        """Every point, validated (a bad one is a ConfigError naming it)."""
        out: list[Point] = []
        for i, params in enumerate(self.combos()):
            where = f"{self.source}: point {i} ({_describe(params)})"
            data = _copy(self.base)
            for path, value in params.items():
                set_dotted(data, path, _copy(value), where)
            out.append(_point(i, params, data, where))
        return out


def _describe(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "base"


def _point(i: int, params: dict[str, Any], data: dict[str, Any], where: str) -> Point:
    cluster_data = data.pop("cluster", None)
    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("arrival"), dict):
        # as `sloserve simulate --config` reads it: the kind and rate default
        workload["arrival"].setdefault("kind", "poisson")
        workload["arrival"].setdefault("rate", 4.0)
    cfg: SimConfig = validate(SimConfig, data, where)
    try:
        make_policy(cfg.policy, cfg.policy_params)
    except ConfigError as e:
        raise ConfigError(f"{where}: policy: {e}") from None
    cluster = None
    if cluster_data is not None:
        if not isinstance(cluster_data, dict):
            raise ConfigError(f"{where}: cluster: expected a mapping")
        cluster = ClusterConfig.load(cluster_data, where)
        try:
            cluster.check(horizon_s=cfg.horizon_s, profile=cfg.instance.profile, policy=cfg.policy)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    return Point(i, params, cfg, cluster, point_key(cfg, cluster))


# ----------------------------------------------------------------------------- running


def _flatten(prefix: str, v: Any, out: dict[str, Any]) -> None:
    if isinstance(v, Mapping):
        for k, x in v.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), x, out)
    elif isinstance(v, (list, tuple)):
        out[prefix] = json.dumps(v, sort_keys=True, default=str)
    elif v is None or isinstance(v, (bool, int, float, str)):
        out[prefix] = v
    else:  # numpy scalars and the like
        try:
            out[prefix] = float(v)
        except (TypeError, ValueError):
            out[prefix] = str(v)


def run_point(task: tuple[str, dict[str, Any], dict[str, Any] | None]) -> dict[str, Any]:
    """Simulate one point (a :attr:`Point.task`); its flattened summary, keyed.

    Module-level and fed plain data, so that processes and Ray workers can run it."""
    key, cfg_data, cluster_data = task
    cfg = SimConfig.model_validate(cfg_data)
    if cluster_data is None:
        from sloserve.experiments.runner import simulate

        summary = simulate(cfg).summary
        extra = {"replicas": 1, "gpu_seconds": summary["simulated_seconds"]}
    else:
        from sloserve.experiments.cluster_run import simulate_cluster

        ccfg = ClusterConfig.model_validate(cluster_data)
        summary = simulate_cluster(cfg, ccfg).summary
        extra = {"replicas": ccfg.num_replicas}
    metrics: dict[str, Any] = {}
    _flatten("", {**summary, **extra}, metrics)
    return {"key": key, "metrics": metrics}


def read_done(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Finished points of an earlier run, by key (a torn last line is ignored)."""
    path = out_dir / POINTS_FILE
    done: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a sweep killed while writing its last line
        if isinstance(rec, dict) and isinstance(rec.get("metrics"), dict) and "key" in rec:
            done[str(rec["key"])] = rec["metrics"]
    return done


@dataclass
class SweepResult:
    """What :func:`run_sweep` produced."""

    table: pd.DataFrame
    out: Path
    ran: int
    skipped: int
    wall_s: float
    axes: tuple[tuple[str, str], tuple[str, str]]
    plot: Path | None
    note: str = ""

    @property
    def front(self) -> pd.DataFrame:
        """The rows on the Pareto front of ``axes``."""
        return self.table[self.table["pareto_front"].astype(bool)]


def table_of(points: Sequence[Point], done: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per finished point, in grid order."""
    names = list(dict.fromkeys(k for p in points for k in p.params))
    rows = []
    for p in points:
        if p.key not in done:
            continue
        row: dict[str, Any] = {"point": p.index, "key": p.key}
        row.update({n: p.params.get(n) for n in names})
        for k, v in done[p.key].items():
            row[f"result.{k}" if k in row else k] = v
        rows.append(row)
    df = pd.DataFrame(rows)
    for n in names:  # a column of mixed scalars (e.g. null and strings): keep it readable
        if n in df and df[n].map(lambda v: isinstance(v, (dict, list))).any():
            df[n] = df[n].map(lambda v: json.dumps(v) if isinstance(v, (dict, list)) else v)
    return df


def run_sweep(
    spec: SweepSpec | Mapping[str, Any] | str | Path,
    out: str | Path,
    *,
    executor: Executor | str | None = None,
    workers: int | None = None,
    pareto: str | Sequence[str] | None = None,
    restart: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Run every point of ``spec`` not already finished in ``out``; write
    ``points.jsonl`` as points finish, then ``summary.parquet`` and ``pareto.png``.

    ``spec``: a :class:`SweepSpec`, its mapping or a YAML path. ``executor``: an
    :class:`~sloserve.experiments.executor.Executor` or its name (default local processes,
    or Ray when ``RAY_ADDRESS`` is set). ``pareto``: ``"x,y"`` metric names, each
    optionally ``:min``/``:max`` (default :data:`~.pareto.DEFAULT_AXES`). ``restart``:
    forget finished points. ``progress(done, total)`` counts points, skipped ones included.
    """
    t0 = time.perf_counter()
    if isinstance(spec, (str, Path)):
        spec = SweepSpec.load(spec)
    elif not isinstance(spec, SweepSpec):
        spec = SweepSpec.from_mapping(spec)
    axes = parse_axes(pareto)
    points = spec.expand()
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out_dir}: cannot create the output folder ({e.strerror})") from e
    if restart:
        (out_dir / POINTS_FILE).unlink(missing_ok=True)
    done = read_done(out_dir)
    todo = list({p.key: p for p in points if p.key not in done}.values())
    skipped = len({p.key for p in points}) - len(todo)
    total, count = skipped + len(todo), skipped
    if progress:
        progress(count, total)
    if todo:
        ex, owned = as_executor(executor, workers)
        try:
            with (out_dir / POINTS_FILE).open("a+") as log:
                log.seek(0, 2)
                if log.tell():
                    log.seek(log.tell() - 1)
                    if log.read(1) != "\n":
                        log.write("\n")  # end a line torn by a kill: the next one is whole

                def on_done(_k: int, rec: dict[str, Any]) -> None:
                    nonlocal count
                    log.write(json.dumps(rec) + "\n")  # metrics keep the summary order
                    log.flush()  # a killed sweep keeps every point finished so far
                    done[rec["key"]] = rec["metrics"]
                    count += 1
                    if progress:
                        progress(count, total)

                ex.map(run_point, [p.task for p in todo], on_done=on_done)
        finally:
            if owned:
                ex.close()
    table = table_of(points, done)
    table["pareto_front"] = pareto_mask(table, axes)
    table.to_parquet(out_dir / SUMMARY_FILE, index=False)
    plot, note = plot_pareto(table, axes, out_dir / PLOT_FILE, list(spec.grid) or None)
    return SweepResult(
        table, out_dir, len(todo), skipped, time.perf_counter() - t0, axes, plot, note
    )


__all__ = [
    "DEFAULT_AXES",
    "Point",
    "SweepResult",
    "SweepSpec",
    "point_key",
    "run_point",
    "run_sweep",
    "set_dotted",
]
