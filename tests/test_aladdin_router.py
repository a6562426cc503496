"""The ``aladdin`` router's switches: oracle output lengths (the §4.3 ablation) and the
failover path (a worker fails under Aladdin: its requests are placed again, none lost or
served twice, and the placement ledger stays in step with the cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_helpers import assert_user_error, run_main, write
from sloserve.cluster.aladdin.perf_models import PerfModels
from sloserve.cluster.aladdin.router import AladdinRouter
from sloserve.cluster.view import ClusterView, RouteRequest, StaticReplica
from sloserve.core.errors import ConfigError

M = PerfModels(h=1e-6, j=0.0, k1=1e-4, c1=0.01, k2=1e-6, c2=1e-3, c3=0.01)


@pytest.mark.parametrize("oracle", [True, False])
def test_oracle_lengths_place_with_the_true_length(oracle: bool) -> None:
    r = AladdinRouter(0, slo_ttft_ms=500, slo_atgt_ms=50, oracle_lengths=oracle, mix="fixed-100-50")
    r.bind(M, kv_capacity_tokens=100_000, kv_bytes_per_token=1024)
    r.true_out[7] = 900
    view = ClusterView([StaticReplica(0)])
    assert r.route(RouteRequest(7, "default", 100), view) == 0
    assert r.placement is not None
    placed = r.placement.workers[0].requests[7]
    assert placed.l_pred == (900 if oracle else 50)  # the history's mean otherwise


def test_oracle_lengths_need_the_true_length() -> None:
    r = AladdinRouter(0, oracle_lengths=True)
    r.bind(M, kv_capacity_tokens=100_000, kv_bytes_per_token=1024)
    with pytest.raises(ConfigError, match="true output length"):
        r.route(RouteRequest(1, "default", 100), ClusterView([StaticReplica(0)]))


def _failover_run(params: dict[str, Any]) -> Any:
    from sloserve.cluster.config import ClusterConfig
    from sloserve.config import validate
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import SimConfig

    cfg = validate(
        SimConfig,
        {
            "instance": {"profile": "llama-2-7b-a100"},
            "workload": {"arrival": {"kind": "poisson", "rate": 10}, "duration_s": 5, "seed": 3},
        },
        "test",
    )
    cluster = ClusterConfig.load(
        {
            "replicas": [{"count": 3}],
            "router": "aladdin",
            "router_params": {"slo_ttft_ms": 400, "slo_atgt_ms": 15, **params},
            # Replica 0 fails and comes back empty; replica 1 fails for good.
            "failures": [
                {"replica": 0, "at_s": 1.5, "recover_s": 3.0},
                {"replica": 1, "at_s": 3.5},
            ],
        },
        "test",
    )
    return simulate_cluster(cfg, cluster)  # the cluster raises if a request ends twice or never


@pytest.mark.parametrize("params", [{}, {"oracle_lengths": True, "scaling": True}])
def test_a_failed_worker_loses_and_duplicates_nothing(params: dict[str, Any]) -> None:
    res = _failover_run(params)
    s, t = res.summary, res.table
    assert s["failovers"] > 0  # requests were on the failed workers and moved
    assert t["req_id"].is_unique and len(t) == s["requests"]
    assert (t["status"] == "finished").all()
    # Each request's output came out once: as many tokens as it asked for.
    assert (t["generated_tokens"] == t["output_tokens"]).all()
    assert (t.loc[t["replica"] == 1, "finish_s"] <= 3.5).all()  # nothing ends on a dead one
    assert (t.loc[t["failovers"] > 0, "arrival_s"] <= 3.5).all()
    # The ledger followed: every request left it when it finished, none is left behind.
    router = res.cluster.router
    assert isinstance(router, AladdinRouter) and router.placement is not None
    assert router.placement.where == {}
    assert all(not w.requests for w in router.placement.workers.values())


def _yaml(tmp_path: Path, params: str) -> Path:
    return write(
        tmp_path / f"c{abs(hash(params))}.yaml",
        f"""workload: {{arrival: {{kind: poisson, rate: 4}}, duration_s: 3, mix: sharegpt}}
instance: {{profile: llama-2-7b-a100}}
cluster:
  replicas: [{{count: 2}}]
  router: aladdin
  router_params: {params}
""",
    )


def test_cli_switches_and_one_line_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = run_main(
        monkeypatch,
        capsys,
        "simulate",
        "--config",
        str(_yaml(tmp_path, "{oracle_lengths: true, rebalance: false, slack: budget}")),
        "--json",
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["finished"] > 0
    for params, needle in (
        ("{slack: nope}", "slack: 'nope'"),
        ("{overflow: drop}", "overflow: 'drop'"),
        ("{theta: 0}", "theta: 0"),
    ):
        bad = run_main(monkeypatch, capsys, "simulate", "--config", str(_yaml(tmp_path, params)))
        assert_user_error(bad, needle)


def test_split_prefill_decode_packs_the_decode_workers() -> None:
    """§5.1: prompts go to the prefill worker (no queue), Algorithm 1 packs the decode
    workers under (b) and (e); JSQ spreads the same requests over all three."""
    from sloserve.cluster.config import ClusterConfig
    from sloserve.config import validate
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import SimConfig

    cfg = validate(
        SimConfig,
        {
            "instance": {"profile": "llama-2-7b-a100"},
            "workload": {"arrival": {"kind": "poisson", "rate": 4}, "duration_s": 10, "seed": 1},
        },
        "test",
    )
    used = {}
    for router, params in (("aladdin", {"slo_ttft_ms": 400, "slo_atgt_ms": 15}), ("jsq", {})):
        cc = ClusterConfig.load(
            {
                "replicas": [{"role": "prefill"}, {"role": "decode", "count": 3}],
                "router": "aladdin" if router == "aladdin" else "least-outstanding",
                "router_params": params,
            },
            "test",
        )
        res = simulate_cluster(cfg, cc)
        t = res.table
        assert len(t) > 30 and (t["status"] == "finished").all()
        assert (t["atgt_s"].dropna() <= 0.015).all()
        used[router] = t["replica"].nunique()  # the decode replica each request ended on
        if router == "aladdin":
            r = res.cluster.router
            assert isinstance(r, AladdinRouter) and r.phase == "prefill" and r.decode
            assert r.decode.placement is not None and r.decode.placement.decode_only
            assert r.decode.placement.where == {}  # finishes reached the decode ledger
            assert not res.cluster.holds
    assert used["aladdin"] == 1 < used["jsq"] == 3


def test_grouped_scheduling_deals_requests_to_groups_round_robin() -> None:
    """Appendix A: with 2 groups of 2 workers, requests alternate between {0, 2} and
    {1, 3}; central best fit packs the same light load onto worker 0."""
    now = [0.0]
    view = ClusterView([StaticReplica(i) for i in range(4)], lambda: now[0])
    picks = {}
    for groups in (1, 2):
        r = AladdinRouter(0, slo_ttft_ms=500, slo_atgt_ms=50, scheduler_groups=groups)
        r.bind(M, kv_capacity_tokens=100_000, kv_bytes_per_token=1024)
        picks[groups] = []
        for i in range(4):  # one a second: the earlier ones are decoding, with slack
            now[0] = float(i)
            picks[groups].append(r.route(RouteRequest(i, "default", 100), view))
    assert picks[1] == [0, 0, 0, 0]  # best fit: the most loaded worker that fits
    assert picks[2] == [0, 1, 0, 1]  # group 0 is {0, 2}, group 1 is {1, 3}
    # e = 10 %: at least 1/(2e) = 5 workers a group.
    r = AladdinRouter(0, group_error=0.1)
    assert [r.groups(w) for w in (4, 5, 10, 12, 64)] == [1, 1, 2, 2, 12]
    with pytest.raises(ConfigError, match="group_error"):
        AladdinRouter(0, group_error=1.0)
    with pytest.raises(ConfigError, match="scheduler_groups"):
        AladdinRouter(0, scheduler_groups=0)
