"""BROS on disaggregated prefill/decode replicas: a request handed to a decode replica has
placeholder token runs (no index of that replica's iteration log) until its first decode
there, and BROS's residual for it is counted from the client's last streamed token (it
indexed the decode replica's empty log: IndexError, the review's repro)."""

from __future__ import annotations

from sloserve.cluster import ClusterConfig
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import InstanceConfig, SimConfig
from sloserve.workloads import PoissonArrivals, WorkloadSpec


def test_bros_serves_every_request_across_a_prefill_decode_split() -> None:
    w = WorkloadSpec(mix="sharegpt", arrival=PoissonArrivals(rate=8.0), duration_s=10, seed=126284)
    icfg = InstanceConfig(
        max_running=8,
        chunk_size=64,
        block_size=16,
        kv_capacity_tokens=20000,
        cpu_swap_gib=0.01,
        cost_model="constant:0.01",
    )
    cc = ClusterConfig.load(
        {
            "replicas": [{"role": "prefill", "count": 2}, {"role": "decode", "count": 2}],
            "router": "least-outstanding",
            "router_params": {"max_outstanding": 10},
            "drains": [{"replica": 1, "at_s": 2.747}],
        }
    )
    res = simulate_cluster(SimConfig(workload=w, instance=icfg, policy="bros"), cc)
    table = res.table
    assert len(table) == len(set(table["req_id"])) > 0
    assert (table["status"] == "finished").all()


def test_last_token_time_is_the_streamed_one_until_a_token_of_its_own() -> None:
    from sloserve.core.request import Request

    r = Request(req_id=0, arrival=0.0, num_prompt_tokens=8, true_output_len=5)
    r.num_output_tokens = 1
    r.token_runs = [0, 0]  # a hand-off's placeholder: no index of this replica's log
    r.streamed_times = [0.25]
    assert r.last_token_time([]) == 0.25
    r.record_tokens(3, 2)  # two tokens of its own here, iterations 3 and 4
    assert r.last_token_time([0.1, 0.2, 0.3, 0.4, 0.5]) == 0.5
