"""``overflow: hold`` in a fixed cluster: a request no worker passes waits in the global
queue, except that a worker with nothing placed (the empty bin Algorithm 1 would open)
takes it; the reproduction's run statistics count TTFT and ATGT attainment apart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from cli_helpers import run_main, write
from sloserve.cluster.aladdin.perf_models import PerfModels
from sloserve.cluster.aladdin.router import AladdinRouter
from sloserve.cluster.controller import Event
from sloserve.cluster.routing import Hold
from sloserve.cluster.view import ClusterView, RouteRequest, StaticReplica

M = PerfModels(h=1e-6, j=0.0, k1=1e-4, c1=0.01, k2=1e-6, c2=1e-3, c3=0.01)
LONG = 10_000  # t_pre = 1.01 s: breaks (c) (TTFT 500 ms) on every worker, even an empty one


def _router(overflow: str) -> AladdinRouter:
    r = AladdinRouter(0, slo_ttft_ms=500, slo_atgt_ms=50, mix="fixed-100-50", overflow=overflow)
    r.bind(M, kv_capacity_tokens=100_000, kv_bytes_per_token=1024)
    return r


@pytest.mark.parametrize("overflow", ["hold", "least-loaded"])
def test_an_empty_worker_takes_what_no_worker_passes(overflow: str) -> None:
    r = _router(overflow)
    view = ClusterView([StaticReplica(0), StaticReplica(1)])
    # Two requests that pass nowhere: each goes to a worker with nothing placed.
    assert r.route(RouteRequest(1, "default", LONG), view) == 0
    assert r.route(RouteRequest(2, "default", LONG), view) == 1
    # The third finds both workers busy: held, or sent to the least loaded.
    third = r.route(RouteRequest(3, "default", LONG), view)
    if overflow == "hold":
        assert isinstance(third, Hold) and "constraints" in third.reason
    else:
        assert third in (0, 1)
    assert r.placement is not None
    assert r.placement.refusals["c"] >= 4  # each worker refused each request by (c)


def test_a_held_request_goes_where_a_request_ended() -> None:
    r = _router("hold")
    view = ClusterView([StaticReplica(0), StaticReplica(1)])
    assert r.route(RouteRequest(1, "default", LONG), view) == 0
    assert r.route(RouteRequest(2, "default", LONG), view) == 1
    assert isinstance(r.route(RouteRequest(3, "default", LONG), view), Hold)
    r.on_event(Event("finish", 1.0, req_id=2), view)  # worker 1 is empty again
    assert r.route(RouteRequest(3, "default", LONG), view) == 1
    assert r.placement is not None and r.placement.where == {1: 0, 3: 1}


def _simulate(overflow: str) -> tuple[pd.DataFrame, dict[str, int], AladdinRouter]:
    from sloserve.cluster.config import ClusterConfig
    from sloserve.config import validate
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import SimConfig

    cfg = validate(
        SimConfig,
        {
            "instance": {"profile": "llama-2-7b-a100"},
            "workload": {"arrival": {"kind": "poisson", "rate": 40}, "duration_s": 4, "seed": 2},
        },
        "test",
    )
    cc = ClusterConfig.load(  # the YAML's cluster section
        {
            "replicas": [{"count": 2}],
            "router": "aladdin",
            "router_params": {"slo_ttft_ms": 400, "slo_atgt_ms": 15, "overflow": overflow},
        },
        "test",
    )
    res = simulate_cluster(cfg, cc)
    router = res.cluster.router
    assert isinstance(router, AladdinRouter)
    return res.table, dict(res.cluster.holds), router


def test_hold_in_a_fixed_cluster_waits_and_loses_nothing() -> None:
    t, holds, router = _simulate("hold")
    assert router.overflow == "hold" and not router.scaling
    assert sum(holds.values()) > 0  # the load is past what the constraints let two take
    assert (t["status"] == "finished").all() and t["req_id"].is_unique
    assert router.placement is not None and router.placement.where == {}
    t2, holds2, router2 = _simulate("least-loaded")
    assert not holds2 and router2.placement is not None and router2.placement.overflows > 0
    # Held requests wait in the global queue: their first token comes later.
    assert t["ttft_s"].max() > t2["ttft_s"].max()


def test_run_stats_count_ttft_and_atgt_apart() -> None:
    from sloserve.experiments.aladdin.plan import SC_70B
    from sloserve.experiments.aladdin.reproduce import _shares, attainment

    ttft, atgt = SC_70B.ttft_ms / 1e3, SC_70B.atgt_ms / 1e3
    table = pd.DataFrame(
        {
            "status": ["finished", "finished", "finished", "aborted"],
            "ttft_s": [0.1, 2 * ttft, 0.1, math.nan],
            "atgt_s": [0.01, 0.01, 2 * atgt, math.nan],
        }
    )
    assert _shares(table, SC_70B) == (0.5, 0.5)
    assert attainment(table, SC_70B) == 0.25
    assert _shares(table.iloc[:0], SC_70B) == (0.0, 0.0)


def test_the_yaml_switch_holds_from_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write(
        tmp_path / "hold.yaml",
        """workload: {arrival: {kind: poisson, rate: 40}, duration_s: 3, seed: 2}
instance: {profile: llama-2-7b-a100}
cluster:
  replicas: [{count: 2}]
  router: aladdin
  router_params: {slo_ttft_ms: 400, slo_atgt_ms: 15, overflow: hold}
""",
    )
    out = run_main(monkeypatch, capsys, "simulate", "--config", str(cfg), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["holds"].get("aladdin: no worker meets the constraints", 0) > 0
    assert s["finished"] == s["requests"]
