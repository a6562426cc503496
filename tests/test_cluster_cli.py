"""The cluster from the command line and the public API: --replicas, --router, --routers and
a YAML ``cluster:`` section; one-line errors for bad cluster input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import sloserve
from cli_helpers import assert_user_error, cli_argv, run_many, write

SIM = ["simulate", "--workload", "sharegpt", "--rate", "6", "--duration", "20", "--json"]

CLUSTER_YAML = """
cluster:
  replicas:
    - {profile: llama-2-7b-a100, count: 2, policy: sarathi}
    - {profile: llama-2-7b-h100, count: 1, policy: vllm, start_s: 5}
  router: least-loaded
  failures: [{replica: 0, at_s: 4, recover_s: 9}]
workload: {mix: sharegpt, arrival: {kind: poisson, rate: 10}, duration_s: 15}
"""


def _summary(proc: object) -> dict[str, object]:
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    s: dict[str, object] = json.loads(proc.stdout)  # type: ignore[attr-defined]
    s.pop("wall_seconds")
    return s


def test_cli_cluster_runs(tmp_path: Path) -> None:
    cfg = write(tmp_path / "cluster.yaml", CLUSTER_YAML)
    procs = run_many(
        {
            "single": cli_argv(*SIM),
            "one": cli_argv(*SIM, "--replicas", "1"),
            "four": cli_argv(*SIM, "--replicas", "4", "--router", "least-outstanding"),
            "yaml": cli_argv("simulate", "--config", cfg, "--json"),
            "routers": cli_argv(
                "compare", "--config", cfg, "--routers", "round-robin,slo-aware", "--json"
            ),
        }
    )
    single, one = _summary(procs["single"]), _summary(procs["one"])
    # One replica behind the pass-through router is today's single-replica run.
    assert {k: one[k] for k in single} == single
    assert one["router"] == "pass-through" and len(one["replicas"]) == 1  # type: ignore[arg-type]

    four = _summary(procs["four"])
    assert four["router"] == "least-outstanding"
    rows = four["replicas"]
    assert isinstance(rows, list) and [r["replica"] for r in rows] == [0, 1, 2, 3]
    assert sum(r["served"] for r in rows) == four["finished"] == single["finished"]

    yaml_run = _summary(procs["yaml"])
    rows = yaml_run["replicas"]
    assert isinstance(rows, list)
    assert [(r["profile"], r["policy"]) for r in rows] == [
        ("llama-2-7b-a100", "sarathi"),
        ("llama-2-7b-a100", "sarathi"),
        ("llama-2-7b-h100", "vllm"),
    ]
    assert yaml_run["failovers"] >= 0 and yaml_run["finished"] == yaml_run["requests"]

    assert procs["routers"].returncode == 0, procs["routers"].stderr
    both = json.loads(procs["routers"].stdout)
    assert list(both) == ["round-robin", "slo-aware", "run"]
    assert both["run"]["router"] == ["round-robin", "slo-aware"]
    assert both["round-robin"]["requests"] == both["slo-aware"]["requests"]


def test_cli_human_output_has_replica_rows(tmp_path: Path) -> None:
    procs = run_many({"h": cli_argv(*SIM[:-1], "--replicas", "2")})
    out = procs["h"].stdout
    assert procs["h"].returncode == 0, procs["h"].stderr
    assert "2 replicas, router round-robin" in out and "GPU-s" in out


@pytest.mark.parametrize(
    ("args", "yaml", "needles"),
    [
        (["--replicas", "0"], None, ["--replicas", "got 0"]),
        (["--router", "nosuch", "--replicas", "2"], None, ["unknown router 'nosuch'"]),
        (
            [],
            "cluster: {replicas: [{profile: no-such-profile, count: 1}]}\n",
            ["cluster.replicas.0.profile", "no-such-profile"],
        ),
        (
            ["--duration", "20"],
            "horizon_s: 30\ncluster: {replicas: [{count: 2}], failures: [{replica: 0, at_s: 99}]}\n",
            ["cluster.failures.0.at_s", "99"],
        ),
        (
            [],
            "cluster: {replicas: [{count: 2}], failures: [{replica: 5, at_s: 1}]}\n",
            ["cluster.failures.0.replica", "5"],
        ),
        ([], "cluster: [1, 2]\n", ["'cluster' must be a mapping"]),
        ([], "cluster: {replicas: [{count: 1}], routr: x}\n", ["unknown key 'routr'"]),
    ],
)
def test_bad_cluster_input_is_one_line(
    tmp_path: Path, args: list[str], yaml: str | None, needles: list[str]
) -> None:
    extra = ["--config", str(write(tmp_path / "c.yaml", yaml))] if yaml else []
    proc = run_many({"x": cli_argv("simulate", "--duration", "20", *extra, *args)})["x"]
    assert_user_error(proc, *needles)


def test_model_no_replica_serves(tmp_path: Path) -> None:
    trace = write(
        tmp_path / "t.csv",
        "arrival_s,prompt_tokens,output_tokens,model\n0.0,100,10,llama-2-70b\n",
    )
    proc = run_many({"x": cli_argv("simulate", "--trace", trace, "--replicas", "2")})["x"]
    assert_user_error(proc, "model 'llama-2-70b' is served by no replica")


def test_public_api_takes_a_cluster_section() -> None:
    cfg = {
        "workload": {"duration_s": 10, "seed": 1},
        "cluster": {"replicas": [{"count": 3}], "router": "round-robin"},
    }
    res = sloserve.simulate(cfg)
    assert sorted(set(res.table["replica"])) == [0, 1, 2]
    assert len(res.summary["replicas"]) == 3
    both = sloserve.compare(cfg, ["vllm", "sarathi"])
    assert both["vllm"].summary["requests"] == both["sarathi"].summary["requests"]
    with pytest.raises(sloserve.ConfigError, match="cluster: router"):
        sloserve.simulate(cfg, cluster={"router": 3})


def test_gpu_seconds_count_every_gpu_and_cost_uses_group_prices() -> None:
    cfg = {
        "instance": {"cost_model": "constant:0.01"},
        "workload": {"duration_s": 10, "models": {"llama-2-7b": 0.5, "llama-2-70b": 0.5}},
        "cluster": {
            "replicas": [
                {"profile": "llama-2-7b-a100", "count": 1, "gpu_hour_usd": 2.0},
                {"profile": "llama-2-70b-a100x2", "count": 1, "gpu_hour_usd": 3.0},
            ],
            "router": "round-robin",
        },
    }
    s = sloserve.simulate(cfg).summary
    small, big = s["replicas"]
    assert (small["gpus"], big["gpus"]) == (1, 2)
    assert big["gpu_seconds"] == pytest.approx(2 * small["gpu_seconds"])
    assert s["gpu_seconds"] == pytest.approx(small["gpu_seconds"] + big["gpu_seconds"])
    expected = (small["gpu_seconds"] * 2.0 + big["gpu_seconds"] * 3.0) / 3600
    assert s["cost_usd"] == pytest.approx(expected)
    # Utilisation is busy time over the replica's own seconds, not over its GPUs.
    assert 0 < big["utilisation"] <= 1
    cfg["cluster"]["replicas"][0].pop("gpu_hour_usd")  # type: ignore[index]
    assert sloserve.simulate(cfg).summary["cost_usd"] is None
