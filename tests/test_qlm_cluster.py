"""QLM in the cluster: the ``qlm`` router/controller and its ``edf``/``fcfs`` baselines end
to end (Python API and CLI), multi-model warm starts, failures, determinism, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import sloserve
from cli_helpers import assert_user_error, cli_argv, run_many, write
from sloserve.core.errors import ConfigError

WORKLOAD: dict[str, Any] = {
    "arrival": {"kind": "poisson", "rate": 6},
    "duration_s": 20,
    "slo": "qlm",
    "classes": {"rt": 0.5, "be": 0.5},
    "seed": 3,
}
MULTI: dict[str, Any] = {
    "replicas": [{"count": 1, "profile": "llama-2-7b-a100"}, {"count": 1, "profile": "phi-2-a100"}],
    "models": {"llama-3-8b": {"profile": "llama-3-8b-a100"}},
}


def _run(router: str, cluster: dict[str, Any] | None = None, **wl: Any) -> Any:
    c = {"replicas": [{"count": 2}], **(cluster or {}), "router": router}
    return sloserve.simulate(
        {"workload": {**WORKLOAD, **wl}}, policy="qlm" if router == "qlm" else "vllm", cluster=c
    )


@pytest.mark.parametrize("router", ["qlm", "edf", "fcfs"])
def test_every_request_ends_once_and_the_summary_has_the_qlm_block(router: str) -> None:
    r = _run(router)
    s = r.summary
    assert s["finished"] == s["requests"] > 50
    assert set(s["deadline_attainment_by_class"]) == {"be", "rt"}
    assert s["qlm"]["mode"] == router
    if router == "qlm":
        assert s["qlm"]["rct_samples"] == s["finished"]


def test_runs_are_deterministic() -> None:
    a, b = _run("qlm"), _run("qlm")
    cols = ["req_id", "replica", "finish_s"] if "finish_s" in a.table else ["req_id", "replica"]
    assert a.table[cols].equals(b.table[cols])
    assert a.summary["qlm"]["plan_calls"] == b.summary["qlm"]["plan_calls"]


def test_multi_model_warm_starts_serve_a_model_no_replica_started_with() -> None:
    models = {"llama-2-7b": 0.4, "phi-2": 0.3, "llama-3-8b": 0.3}
    for router in ("qlm", "edf"):
        r = _run(router, MULTI, models=models)
        s = r.summary
        assert s["finished"] == s["requests"], router
        assert s["qlm"]["model_changes"] >= 1
        # the baseline reads llama-3-8b from disk; QLM had it prefetched to CPU memory
        tier = "cpu" if router == "qlm" else "disk"
        assert s["model_loads_by_tier"].get(tier, 0) >= 1
        served = r.table[r.table["model"] == "llama-3-8b"]
        assert len(served) and (served["status"] == "finished").all()


def test_without_the_warm_start_lso_every_model_change_loads_cold() -> None:
    models = {"llama-2-7b": 0.4, "phi-2": 0.3, "llama-3-8b": 0.3}
    cold = _run("qlm", {**MULTI, "router_params": {"lsos": "pull,balance"}}, models=models)
    loads = cold.summary["model_loads"]
    assert loads and all(x["tier"] == "disk" for x in loads)
    # the cold load is visible in the TTFT of the first request that waited for it
    t = cold.table.sort_values("arrival_s")
    first = t[t["model"] == "llama-3-8b"].iloc[0]
    load = next(x for x in loads if x["model"] == "llama-3-8b")
    assert first["ttft_s"] >= load["end_s"] - load["start_s"]


def test_a_failed_replicas_groups_finish_elsewhere() -> None:
    r = _run("qlm", {"failures": [{"replica": 0, "at_s": 5.0}]})
    s = r.summary
    assert s["finished"] == s["requests"]
    assert s["failovers"] >= 1
    late = r.table[r.table["arrival_s"] > 6.0] if "arrival_s" in r.table else r.table
    assert set(late["replica"]) == {1}


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"alpha": 1.5}, "alpha: must be in (0, 1), got 1.5"),
        ({"alpha": 0.0}, "alpha"),
        ({"group_size_factor": 0}, "group_size_factor: must be > 0, got 0"),
        ({"lsos": "pull,teleport"}, "unknown LSO 'teleport'"),
    ],
)
def test_bad_router_params_are_config_errors(params: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        _run("qlm", {"router_params": params})


def test_cli_simulate_and_compare_with_qlm(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "q.yaml",
        "workload: {arrival: {kind: poisson, rate: 6}, duration_s: 6, slo: qlm,"
        " classes: {rt: 0.5, be: 0.5}}\npolicy: qlm\n",
    )
    bad = write(
        tmp_path / "b.yaml",
        "cluster: {replicas: [{count: 2}], router: qlm, router_params: {alpha: 2}}\n",
    )
    procs = run_many(
        {
            "sim": cli_argv(
                "simulate", "--config", cfg, "--replicas", "2", "--router", "qlm", "--json"
            ),
            "cmp": cli_argv(
                "compare",
                "--config",
                cfg,
                "--replicas",
                "2",
                "--routers",
                "qlm,round-robin",
                "--json",
            ),
            "bad": cli_argv("simulate", "--config", bad, "--duration", "5"),
            "slo": cli_argv(
                "simulate",
                "--config",
                write(tmp_path / "s.yaml", "workload: {slo: {rt: {deadline_s: 0}}}\n"),
                "--replicas",
                "2",
                "--router",
                "qlm",
            ),
            "cls": cli_argv(
                "simulate",
                "--config",
                write(tmp_path / "c.yaml", "workload: {classes: {urgent: 1}}\n"),
                "--replicas",
                "2",
                "--router",
                "qlm",
            ),
        }
    )
    assert procs["sim"].returncode == 0, procs["sim"].stderr
    s = json.loads(procs["sim"].stdout)
    assert s["router"] == "qlm" and "qlm" in s and s["finished"] == s["requests"]
    assert procs["cmp"].returncode == 0, procs["cmp"].stderr
    assert "qlm" in procs["cmp"].stdout and "round-robin" in procs["cmp"].stdout
    assert_user_error(procs["bad"], "alpha", "2")
    assert_user_error(procs["slo"], "workload.slo")  # deadline <= 0
    assert_user_error(procs["cls"], "urgent")


def test_the_reproduction_writes_its_tables_figures_and_headline(tmp_path: Path) -> None:
    from sloserve.experiments.qlm import Plan, burst_table, reproduce, system_table

    plan = Plan((0.5,), 6.0, {"W_A": 8.0, "W_B": 20.0}, (4.0,), 0, (4,), (4.0,)).built()
    assert {r.system for r in plan.runs} >= {
        "qlm",
        "edf",
        "fcfs",
        "round-robin",
        "fcfs-swap",
        "edf-swap",
        "qlm-no-warm-start",
        "qlm-no-eviction",
    }
    rep = reproduce(plan, tmp_path)
    for f in ("results.csv", "plan_times.csv", "headline.json", "attainment.png", "plan_time.png"):
        assert (tmp_path / f).is_file(), f
    head = json.loads((tmp_path / "headline.json").read_text())
    assert head["paper"] == "qlm" and head["plan"]["runs"] == len(plan.runs)
    assert "attainment_gain_vs_best_baseline_W_A" in head["values"]
    assert "throughput_gain_vs_naive_swap_W_A" in head["values"]
    assert "warm_start_window_throughput_gain_W_A" in head["values"]
    # served while arrivals last: never more than finished, each within the 6 s window
    res = rep.results
    assert (res["window_requests_per_s"] * 6.0 <= res["finished"] + 1e-9).all()
    assert (res["window_requests_per_s"] > 0).any()
    ids = {c["id"] for c in head["claims"]}
    assert {"attainment_W_A_vs_fcfs-swap", "warm_start", "eviction", "rct_wait_r2"} <= ids
    for c in head["claims"]:
        assert set(c) >= {"claim", "paper", "ours", "setting", "reproduced"}
    t = system_table(rep.results)
    assert set(t["workload"]) == {"W_A", "W_B"} and (t["attainment"] > 0).all()
    # the burst runs (CV 4) are their own table, not averaged into the main one
    res = rep.results
    poisson = res[(res["workload"] == "W_B") & (res["system"] == "qlm") & (res["arrival_cv"] == 1)]
    qlm_b = t[(t["workload"] == "W_B") & (t["system"] == "qlm")]["attainment"]
    assert qlm_b.iloc[0] == pytest.approx(poisson["attainment"].mean())
    b = burst_table(res)
    assert set(zip(b["arrival_cv"], b["system"], strict=True)) == {
        (cv, s) for cv in (1.0, 4.0) for s in ("qlm", "edf", "fcfs-swap")
    }
    with pytest.raises(ConfigError, match="rt_shares"):
        Plan((1.5,), 6.0, {"W_B": 20.0}, (4.0,)).built()


@pytest.mark.parametrize("router", ["qlm", "static-batch", "edf-swap", "edf"])
def test_the_same_router_serves_live_in_the_emulated_gateway(router: str) -> None:
    import asyncio
    import time

    from sloserve.cluster.qlm import QLMRouter
    from sloserve.serve.backend import GenerationRequest
    from sloserve.serve.emulated import EmulatedBackend, EmulatedConfig

    backend = EmulatedBackend(EmulatedConfig(replicas=2, router=router, time_scale=50))
    assert backend.router.name == router and isinstance(backend.router, QLMRouter)

    async def serve() -> list[int]:
        await backend.start()
        req = lambda i: GenerationRequest(  # noqa: E731
            f"cmpl-{i}",
            "completions",
            backend.model_name,
            prompt_tokens=200,
            max_tokens=16,
            arrival=time.monotonic(),
        )
        streams = []
        for i in range(4):
            streams.append([c async for c in backend.generate(req(i))])
        await backend.stop()
        return [sum(c.num_tokens for c in s) for s in streams]

    assert asyncio.run(serve()) == [16] * 4
