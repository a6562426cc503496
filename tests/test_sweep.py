"""experiments.sweep and `sloserve sweep`: grid expansion, one parquet row per point,
resumability, the Pareto front, clusters, and identical results on every executor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from cli_helpers import assert_user_error, run_main
from sloserve.cli import app
from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.experiments.executor import LocalExecutor
from sloserve.experiments.pareto import pareto_mask, parse_axes
from sloserve.experiments.sweep import SweepSpec, run_point, run_sweep, set_dotted

BASE: dict[str, Any] = {"workload": {"mix": "sharegpt", "duration_s": 3}}
GRID: dict[str, Any] = {
    "base": BASE,
    "grid": {
        "policy": ["vllm", "sarathi"],
        "workload.arrival.rate": [2, 6],
        "workload.seed": [0, 1],
    },
}


def _results(t: pd.DataFrame) -> pd.DataFrame:
    """Everything but the wall-clock time, which is the only thing allowed to differ."""
    return t.drop(columns=[c for c in t.columns if c.endswith("wall_seconds")])


def test_grid_is_the_cartesian_product_in_order_with_points_crossed() -> None:
    spec = SweepSpec.from_mapping(
        {**GRID, "points": [{"instance.max_running": 64}, {"instance.max_running": 128}]}
    )
    pts = spec.expand()
    assert len(pts) == 2 * 8
    assert pts[0].params == {
        "instance.max_running": 64,
        "policy": "vllm",
        "workload.arrival.rate": 2,
        "workload.seed": 0,
    }
    assert pts[1].params["workload.seed"] == 1 and pts[8].params["instance.max_running"] == 128
    assert pts[5].config.policy == "sarathi" and pts[5].config.workload.arrival.rate == 2
    assert len({p.key for p in pts}) == 16


def test_base_policies_is_a_policy_axis_and_equal_configs_share_a_key() -> None:
    spec = SweepSpec.from_mapping({"base": {**BASE, "policies": ["vllm", "edf"]}})
    assert [p.config.policy for p in spec.expand()] == ["vllm", "edf"]
    a = SweepSpec.from_mapping({"base": BASE, "grid": {"workload.arrival.rate": [4, 4.0]}})
    k = [p.key for p in a.expand()]
    assert k[0] == k[1]
    # the default rate spelled out is the same run as the default left out
    b = SweepSpec.from_mapping({"base": BASE}).expand()[0]
    assert b.key == k[0]


def test_set_dotted_indexes_lists_and_names_bad_paths() -> None:
    d: dict[str, Any] = {}
    set_dotted(d, "cluster.replicas.0.count", 4, "here")
    set_dotted(d, "cluster.replicas.1.profile", "llama-2-7b-h100", "here")
    assert d == {"cluster": {"replicas": [{"count": 4}, {"profile": "llama-2-7b-h100"}]}}
    with pytest.raises(ConfigError, match=r"here: cluster.replicas.5.count: no item '5'"):
        set_dotted(d, "cluster.replicas.5.count", 1, "here")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {"grid": {"workload.arival.rate": [1]}},
            r"point 0 \(workload.arival.rate=1\): unknown key",
        ),
        (
            {"grid": {"policy": ["vllm", "nope"]}},
            r"point 1 \(policy=nope\): policy: unknown policy",
        ),
        ({"grid": {"workload.arrival.rate": [2, -1]}}, r"point 1 .*rate"),
        ({"grid": {"policy": []}}, r"grid.policy: expected a non-empty list"),
        ({"grids": {}}, r"unknown key 'grids'"),
        ({"grid": {"cluster.router": ["nope"]}}, r"point 0 \(cluster.router=nope\): .*router"),
    ],
)
def test_bad_points_fail_before_anything_runs(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SweepSpec.from_mapping({"base": BASE, **data}, "g.yaml").expand()


def test_run_sweep_writes_one_row_per_point_and_serial_equals_processes(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    a = run_sweep(
        GRID, tmp_path / "a", executor=LocalExecutor(1), progress=lambda d, n: seen.append((d, n))
    )
    b = run_sweep(GRID, tmp_path / "b", executor="local", workers=2)
    assert a.ran == 8 and a.skipped == 0 and seen[-1] == (8, 8)
    t = pd.read_parquet(tmp_path / "a" / "summary.parquet")
    assert len(t) == 8 and list(t["point"]) == list(range(8))
    for col in ("policy", "workload.arrival.rate", "workload.seed", "key", "pareto_front"):
        assert col in t.columns
    # metrics flattened; the summary's own 'policy' is under result.policy
    assert {"ttft_attainment", "slo_attainment_by_class.rt", "limits.max_running"} <= set(t.columns)
    assert (t["result.policy"] == t["policy"]).all()
    assert (t["gpu_seconds"] == t["simulated_seconds"]).all() and (t["replicas"] == 1).all()
    pd.testing.assert_frame_equal(_results(a.table), _results(b.table))
    assert (tmp_path / "a" / "pareto.png").stat().st_size > 10_000


def test_a_killed_sweep_resumes_and_ends_with_the_same_table(tmp_path: Path) -> None:
    full = run_sweep(GRID, tmp_path / "s", executor=LocalExecutor(1))
    log = tmp_path / "s" / "points.jsonl"
    lines = log.read_text().splitlines()
    assert len(lines) == 8
    # killed after 3 points, in the middle of writing the 4th
    log.write_text("\n".join(lines[:3]) + "\n" + lines[3][:25])
    again = run_sweep(GRID, tmp_path / "s", executor=LocalExecutor(2))
    assert (again.ran, again.skipped) == (5, 3)
    pd.testing.assert_frame_equal(_results(full.table), _results(again.table))
    assert run_sweep(GRID, tmp_path / "s").ran == 0
    assert run_sweep(GRID, tmp_path / "s", restart=True, executor=LocalExecutor(1)).ran == 8


def test_cluster_routers_and_replica_counts_sweep(tmp_path: Path) -> None:
    spec = {
        "base": {
            "workload": {"mix": "sharegpt", "duration_s": 3, "arrival": {"rate": 8}},
            "cluster": {"router": "round-robin", "replicas": [{"count": 2}]},
        },
        "grid": {
            "cluster.router": ["round-robin", "least-outstanding"],
            "cluster.replicas.0.count": [2, 3],
        },
    }
    res = run_sweep(
        spec, tmp_path / "c", executor=LocalExecutor(1), pareto="gpu_seconds,slo_attainment"
    )
    t = res.table
    assert list(t["replicas"]) == [2, 3, 2, 3]
    assert list(t["router"]) == list(t["cluster.router"])
    # a cluster of n replicas pays n GPUs for the whole run
    np.testing.assert_allclose(t["gpu_seconds"], t["replicas"] * t["simulated_seconds"])
    assert res.axes == (("gpu_seconds", "min"), ("slo_attainment", "max"))


def test_pareto_front_by_hand() -> None:
    t = pd.DataFrame(
        {
            "cost": [1.0, 2.0, 2.0, 3.0, 4.0, np.nan],
            "slo_attainment": [0.5, 0.9, 0.8, 0.9, 1.0, 1.0],
        }
    )
    axes = parse_axes("cost,slo_attainment")
    assert axes == (("cost", "min"), ("slo_attainment", "max"))
    assert pareto_mask(t, axes).tolist() == [True, True, False, False, True, False]
    assert parse_axes(["cost:max", "x:min"]) == (("cost", "max"), ("x", "min"))
    with pytest.raises(ConfigError, match="two metrics"):
        parse_axes("a,b,c")
    with pytest.raises(ConfigError, match="direction must be min or max"):
        parse_axes("a:up,b")
    with pytest.raises(ConfigError, match="no metric 'nope'"):
        pareto_mask(t, parse_axes("nope,cost"))


def test_cli_sweep_json_resumes_and_bad_input_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "g.yaml"
    cfg.write_text(yaml.safe_dump(GRID))
    out = tmp_path / "o"
    args = ["sweep", "--config", str(cfg), "--out", str(out), "--workers", "1", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert (info["points"], info["ran"], info["executor"]) == (8, 8, "local")
    assert info["pareto_front"] and all("ttft_attainment" in p for p in info["pareto_front"])
    # what ran: the grid and the base run's workload, profile, policy, SLOs and seed
    assert info["run"]["points"] == 8 and set(info["run"]["grid"]) == set(GRID["grid"])
    assert info["run"]["base"]["seed"] == BASE["workload"].get("seed", 0)
    r = CliRunner().invoke(app, args[:-1])
    assert r.exit_code == 0 and "8 points (0 run on local, 8 already done)" in r.stdout
    assert r.stdout.startswith("sweep of 8 points over ")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"base": BASE, "grid": {"policy": ["vlm"]}}))
    proc = run_main(monkeypatch, capsys, "sweep", "--config", str(bad), "--out", str(out))
    assert_user_error(proc, f"{bad}: point 0 (policy=vlm): policy:")
    proc = run_main(monkeypatch, capsys, "sweep", "--config", str(cfg), "--executor", "dask")
    assert_user_error(proc, "unknown executor 'dask'; valid: local, ray")


@pytest.fixture
def local_ray() -> Any:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_a_grid_gives_the_same_table_on_local_ray_and_local_processes(
    tmp_path: Path, local_ray: Any
) -> None:
    from sloserve.experiments.executor import RayExecutor

    ray_ex = RayExecutor()
    assert ray_ex.workers == 2
    on_ray = run_sweep(GRID, tmp_path / "r", executor=ray_ex)
    with LocalExecutor(2) as ex:
        local = run_sweep(GRID, tmp_path / "l", executor=ex)
    assert on_ray.ran == 8
    pd.testing.assert_frame_equal(_results(on_ray.table), _results(local.table))
    # a task's own error comes back as itself, not wrapped in Ray's
    bad = ("k", {"workload": {"duration_s": 1}}, {"router": "nope"})
    with pytest.raises(ConfigError) as ei:
        ray_ex.map(run_point, [bad])
    assert type(ei.value) is UnknownNameError and str(ei.value).startswith("unknown router")
