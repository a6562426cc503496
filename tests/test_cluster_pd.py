"""Disaggregated prefill/decode: token times by hand, the TTFT/TPOT trade-off, failures
during a KV transfer, the measured link default, bad input and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cli_helpers import assert_user_error, cli_argv, run_many, write
from sloserve.cluster import Cluster, ClusterConfig
from sloserve.cluster.replica import ReplicaSpec
from sloserve.cluster.routing import make_router
from sloserve.core.errors import ConfigError
from sloserve.core.request import Request, RequestStatus
from sloserve.costmodel.catalog import gpu_spec
from sloserve.costmodel.profile import load_profile
from sloserve.costmodel.transfer import MEASURED_KV_LINK_GB_PER_S, default_kv_link_gb_per_s
from sloserve.engine.env import Environment
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import InstanceConfig, SimConfig, build_instance
from sloserve.workloads import PoissonArrivals, UniformLength, WorkloadSpec

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
_FAST = SimConfig(instance=InstanceConfig(cost_model="constant:0.01"))
_PD = [{"role": "prefill"}, {"role": "decode"}]


def _rate_for(seconds_per_100_tokens: float) -> float:
    """The link rate (GB/s) at which 100 prompt tokens of KV take the given time."""
    prof = load_profile(_FAST.instance.profile)
    return 100 * prof.model.kv_bytes_per_token_tp(prof.tp) / seconds_per_100_tokens / 1e9


def test_token_times_match_a_hand_computation() -> None:
    # Every iteration takes 0.01 s. The link moves 100 tokens of KV in 4 ms.
    # A (t=0, 100 prompt, 3 out): prefill [0, .01] on replica 0 -> token 1 at .01; its
    #   KV (100 tokens) arrives at replica 1 at .014; decode steps end .024 (token 2)...
    # B (t=.005, 50 prompt, 2 out): prefill [.01, .02] -> token 1 at .02; transfer 2 ms,
    #   at replica 1 at .022, mid A's step: it joins the next step [.024, .034], with A.
    #   So A's token 3 and B's token 2 both end at .034.
    reqs = [
        Request(req_id=0, arrival=0.0, num_prompt_tokens=100, true_output_len=3),
        Request(req_id=1, arrival=0.005, num_prompt_tokens=50, true_output_len=2),
    ]
    cc = ClusterConfig(replicas=_PD, transfer={"kv_link_gb_per_s": _rate_for(0.004)})
    res = simulate_cluster(_FAST, cc, reqs, check_invariants=True)
    a = res.timeline(0)["delivered_s"].to_numpy()
    b = res.timeline(1)["delivered_s"].to_numpy()
    np.testing.assert_allclose(a, [0.01, 0.024, 0.034], atol=1e-12)
    np.testing.assert_allclose(b, [0.02, 0.034], atol=1e-12)
    t = res.table.set_index("req_id")
    assert t.loc[0, "ttft_s"] == pytest.approx(0.01)
    assert t.loc[1, "ttft_s"] == pytest.approx(0.015)
    # TPOT = (t_last - t_first) / (n - 1): the transfer is inside the first gap, once.
    assert t.loc[0, "tpot_s"] == pytest.approx((0.034 - 0.01) / 2)
    assert t.loc[1, "tpot_s"] == pytest.approx(0.014)
    assert t.loc[0, "max_gap_s"] == pytest.approx(0.014)  # 4 ms transfer + 10 ms step
    assert list(t["replica"]) == [1, 1] and list(t["status"]) == ["finished"] * 2
    s = res.summary
    assert s["kv_transfers"] == 2 and s["kv_transfers_lost"] == 0
    assert s["kv_transfer_s_mean"] == pytest.approx(0.003)
    rows = {r["replica"]: r for r in s["replicas"]}
    assert (rows[0]["role"], rows[0]["handed_off"], rows[0]["served"]) == ("prefill", 2, 0)
    assert (rows[1]["role"], rows[1]["handed_off"], rows[1]["served"]) == ("decode", 0, 2)
    # The decode replica never prefilled: its KV held the computed prompts (no recompute).
    assert all(r.num_preemptions == 0 for r in res.requests)


def test_a_one_token_request_finishes_on_the_prefill_replica() -> None:
    reqs = [Request(req_id=0, arrival=0.0, num_prompt_tokens=10, true_output_len=1)]
    res = simulate_cluster(_FAST, ClusterConfig(replicas=_PD), reqs)
    assert res.table["replica"].tolist() == [0]
    assert res.summary["kv_transfers"] == 0


def test_the_default_link_is_the_gpus_measured_rate() -> None:
    # 100 prompt tokens of llama-2-7b KV (512 KiB a token) over the A100's 224 GB/s.
    reqs = [Request(req_id=0, arrival=0.0, num_prompt_tokens=100, true_output_len=2)]
    res = simulate_cluster(_FAST, ClusterConfig(replicas=_PD), reqs)
    prof = load_profile(_FAST.instance.profile)
    assert prof.gpu.name.startswith("A100")
    expect = 100 * prof.model.kv_bytes_per_token_tp(prof.tp) / 224.0e9
    assert res.summary["kv_transfer_s_mean"] == pytest.approx(expect)
    assert default_kv_link_gb_per_s(gpu_spec("h100-80gb")) == 340.8
    h200 = gpu_spec("h200")
    assert default_kv_link_gb_per_s(h200) == h200.pcie_gb_per_s  # not measured: PCIe
    pcie = gpu_spec("a100-80gb-pcie")  # an A100, but no NVLink: the measurement is not its link
    assert default_kv_link_gb_per_s(pcie) == pcie.pcie_gb_per_s == 25.0


@pytest.mark.skipif(not (SHARED / "vidur-profiling").exists(), reason="no shared profiling")
def test_measured_rates_come_from_vidurs_send_recv() -> None:
    net = SHARED / "vidur-profiling" / "network"
    for family, folder in (
        ("A100", "a100_dgx"),
        ("H100", "h100_dgx"),
        ("A40", "a40_pairwise_nvlink"),
    ):
        d = pd.read_csv(net / folder / "send_recv.csv")
        big = d[(d["devices_per_node"] == 2) & (d["size"] >= 32 << 20)]
        gbps = (big["size"] / (big["time_stats.send_recv.median"] * 1e-3) / 1e9).median()
        assert MEASURED_KV_LINK_GB_PER_S[family] == pytest.approx(gbps, abs=0.05), family


def test_a_prefill_failure_during_a_transfer_serves_the_request_again() -> None:
    # A's KV takes 1 s to move; replica 0 (prefill) fails at 0.5 s and recovers at 0.6 s:
    # the transfer is lost, A is prefilled again from scratch and handed off again.
    reqs = [Request(req_id=0, arrival=0.0, num_prompt_tokens=100, true_output_len=3)]
    cc = ClusterConfig(
        replicas=_PD,
        transfer={"kv_link_gb_per_s": _rate_for(1.0)},
        failures=[{"replica": 0, "at_s": 0.5, "recover_s": 0.6}],
    )
    res = simulate_cluster(_FAST, cc, reqs, check_invariants=True)
    s = res.summary
    assert (s["kv_transfers"], s["kv_transfers_lost"], s["failovers"]) == (1, 1, 1)
    r = res.requests[0]
    assert r.status is RequestStatus.FINISHED and r.num_failovers == 1
    # Client: token 1 at .01 (not delivered twice); prefill again [.6, .61], transfer 1 s,
    # decode steps end 1.62 and 1.63.
    np.testing.assert_allclose(res.timeline(0)["delivered_s"], [0.01, 1.62, 1.63], atol=1e-9)
    assert res.table.loc[0, "ttft_s"] == pytest.approx(0.01)


def test_a_decode_failure_sends_its_requests_back_to_prefill() -> None:
    reqs = [
        Request(req_id=i, arrival=0.0, num_prompt_tokens=20, true_output_len=50) for i in (0, 1)
    ]
    cc = ClusterConfig(
        replicas=[{"role": "prefill"}, {"role": "decode", "count": 2}],
        router="round-robin",
        failures=[{"replica": 1, "at_s": 0.2}],
    )
    res = simulate_cluster(_FAST, cc, reqs, check_invariants=True)
    t = res.table
    assert (t["status"] == "finished").all() and (t["generated_tokens"] == 50).all()
    assert res.summary["kv_transfers"] == 3  # two, then the failed-over one again
    assert set(t["replica"]) == {2}
    for i in (0, 1):
        assert res.timeline(i)["delivered_s"].is_monotonic_increasing
        assert len(res.timeline(i)) == 50


def test_pd_trades_ttft_for_tpot_on_the_same_gpu_count() -> None:
    # Measured (sarathi, llama-2-7b A100 profile, Poisson 10/s, prompts 200-2000, outputs
    # 50-300, least-outstanding): 3 co-located replicas TTFT p50 0.120 s, TPOT p50 17.4 ms;
    # 1 prefill + 2 decode 0.379 s / 15.5 ms; 2 prefill + 1 decode 0.104 s / 28.8 ms.
    cfg = SimConfig(
        workload=WorkloadSpec(
            arrival=PoissonArrivals(rate=10),
            duration_s=20,
            seed=5,
            prompt=UniformLength(low=200, high=2000),
            output=UniformLength(low=50, high=300),
        ),
        policy="sarathi",
        horizon_s=200,
    )

    def run(groups: list[dict[str, object]]) -> tuple[float, float]:
        cc = ClusterConfig(replicas=groups, router="least-outstanding")
        t = simulate_cluster(cfg, cc).table
        assert (t["status"] == "finished").all()
        return float(t["ttft_s"].median()), float(t["tpot_s"].median())

    colo = run([{"count": 3}])
    p1d2 = run([{"role": "prefill"}, {"role": "decode", "count": 2}])
    p2d1 = run([{"role": "prefill", "count": 2}, {"role": "decode"}])
    assert p1d2[1] < 0.97 * colo[1] and p1d2[0] > 1.5 * colo[0]  # TPOT down, TTFT up
    assert p2d1[0] < colo[0] and p2d1[1] > 1.3 * colo[1]  # TTFT down, TPOT up


def test_client_abort_during_a_transfer() -> None:
    env = Environment()
    cfg = _FAST
    prof = load_profile(cfg.instance.profile)
    specs = [
        ReplicaSpec(0, 0, prof.name, "vllm", "m", 0.0, "prefill"),
        ReplicaSpec(1, 1, prof.name, "vllm", "m", 0.0, "decode"),
    ]
    clu = Cluster(
        env,
        specs,
        lambda s, i: build_instance(cfg, env, instance_id=i, profile=prof),
        make_router("pass-through", {}),
        kv_transfer=lambda spec, r: 1.0,
    )
    req = Request(req_id=0, arrival=0.0, num_prompt_tokens=10, true_output_len=5)
    clu.add_request(req)
    env.run(until=0.5)  # token 1 at .01, in transfer until 1.01
    assert req.req_id in clu.handoff.in_flight  # type: ignore[union-attr]
    assert clu.abort(req) and req.status is RequestStatus.ABORTED
    env.run(until=2.0)  # the transfer's end is stale now
    assert not clu.close(2.0) and clu.ended == {0: req}


@pytest.mark.parametrize(
    ("groups", "needle"),
    [
        ([{"role": "decode", "count": 2}], "roles: decode"),
        ([{"role": "prefill"}], "roles: prefill"),
        ([{"role": "prefill"}, {"role": "decode"}, {}], "roles: both, decode, prefill"),
    ],
)
def test_roles_that_cannot_hand_off_are_one_line_errors(
    groups: list[dict[str, object]], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle) as e:
        simulate_cluster(_FAST, ClusterConfig(replicas=groups))
    assert "\n" not in str(e.value)


def test_the_cluster_api_needs_a_transfer_time_for_roles() -> None:
    env = Environment()
    specs = [
        ReplicaSpec(0, 0, "p", "vllm", "m", 0.0, "prefill"),
        ReplicaSpec(1, 1, "p", "vllm", "m", 0.0, "decode"),
    ]
    with pytest.raises(ConfigError, match="KV transfer time"):
        Cluster(env, specs, lambda s, i: None, make_router("pass-through", {}))  # type: ignore[arg-type,return-value]


def test_cli_simulate_config_with_roles(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "pd.yaml",
        "workload: {duration_s: 3, arrival: {kind: poisson, rate: 5}, seed: 1}\n"
        "instance: {cost_model: 'constant:0.01'}\n"
        "cluster:\n"
        "  router: round-robin\n"
        "  replicas: [{role: prefill, count: 1}, {role: decode, count: 2}]\n",
    )
    bad = write(tmp_path / "bad.yaml", "cluster: {replicas: [{role: decode, count: 2}]}\n")
    out = tmp_path / "out"
    procs = run_many(
        {
            "ok": cli_argv("simulate", "--config", cfg, "--out", out),
            "bad": cli_argv("simulate", "--config", bad),
        }
    )
    assert procs["ok"].returncode == 0, procs["ok"].stderr
    summary = json.loads((out / "summary.json").read_text())["vllm"]
    assert summary["kv_transfers"] > 0
    assert [r["role"] for r in summary["replicas"]] == ["prefill", "decode", "decode"]
    t = pd.read_parquet(out / "requests.parquet")
    assert set(t.loc[t["output_tokens"] > 1, "replica"]) == {1, 2}
    assert_user_error(procs["bad"], "disaggregated serving needs prefill and decode groups")
