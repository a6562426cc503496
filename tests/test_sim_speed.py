"""The speed-ups change no result: the cluster's narrowed fast path, the column-wise
request table (chunked, gathered timelines) and the delivered-QoE shortcut."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import sloserve.cluster.cluster as cluster_mod
import sloserve.metrics.summary as summary_mod
from sloserve.cluster import ClusterConfig
from sloserve.engine.env import PRIO_ARRIVAL, PRIO_CONTROL, PRIO_ITERATION, Environment
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import InstanceConfig, SimConfig
from sloserve.metrics.qoe import andes_qoe, delivered_qoe
from sloserve.workloads import PoissonArrivals, WorkloadSpec


def _cfg(policy: str, rate: float = 24.0, horizon: float | None = None) -> SimConfig:
    w = WorkloadSpec(mix="sharegpt", arrival=PoissonArrivals(rate=rate), duration_s=20, seed=4)
    return SimConfig(
        workload=w, instance=InstanceConfig(max_running=32), policy=policy, horizon_s=horizon
    )


def test_peek_control_and_cancel() -> None:
    env = Environment()
    seen: list[str] = []
    env.schedule(1.0, lambda: seen.append("it1"), PRIO_ITERATION)
    env.schedule(2.0, lambda: seen.append("arr"), PRIO_ARRIVAL)
    env.schedule(3.0, lambda: seen.append("ctl"), PRIO_CONTROL)
    gone = env.schedule(4.0, lambda: seen.append("cancelled"), PRIO_ITERATION)
    env.schedule(3.5, lambda: env.cancel(gone), PRIO_ITERATION)
    assert (env.peek(), env.peek_control()) == (1.0, 3.0)
    env.step()
    env.step()
    assert env.peek_control() == 3.0 and len(env) == 3
    env.run()
    assert seen == ["it1", "arr", "ctl"] and env.peek_control() == float("inf")
    assert env.now == 3.5 and env.peek() == float("inf") and len(env) == 0


@pytest.mark.parametrize(
    ("policy", "cluster"),
    [
        ("sarathi", {"replicas": [{"count": 3}], "router": "least-outstanding"}),
        ("vllm", {"replicas": [{"count": 3}], "router": "round-robin"}),
        # holds in the global queue (pulls when requests end) and a failure with recovery
        (
            "sarathi",
            {
                "replicas": [{"count": 3}],
                "router": "least-outstanding",
                "router_params": {"max_outstanding": 6},
                "failures": [{"replica": 1, "at_s": 6.0, "recover_s": 9.0}],
            },
        ),
        (
            "vllm",
            {"replicas": [{"count": 4}], "router": "power-of-two", "router_params": {"kv_weight": 0}},
        ),
        # routers whose only progress read is KV usage (exact mid-run: fastpath.kv_blocks_at)
        ("vllm", {"replicas": [{"count": 3}], "router": "least-loaded"}),
        ("sarathi", {"replicas": [{"count": 4}], "router": "power-of-two"}),
        ("vllm", {"replicas": [{"count": 3}], "router": "least-kv"}),
        (
            "sarathi",
            {
                "replicas": [{"count": 3}],
                "router": "least-loaded",
                "router_params": {"kv_weight": 1.0},
                "failures": [{"replica": 0, "at_s": 5.0, "recover_s": 8.0}],
            },
        ),
    ],
)
@pytest.mark.parametrize("kv_tokens", [None, 6000])  # 6,000: KV fills, preemptions
def test_fast_forwarding_routers_give_the_same_requests_with_fewer_decisions(
    policy: str, cluster: dict, kv_tokens: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cc = ClusterConfig.load(cluster)
    cfg = _cfg(policy)
    if kv_tokens is not None:
        cfg = cfg.model_copy(
            update={"instance": cfg.instance.model_copy(update={"kv_capacity_tokens": kv_tokens})}
        )
    fast = simulate_cluster(cfg, cc)
    # The same run with every replica stopping at every event (the behaviour before).
    monkeypatch.setattr(cluster_mod.Cluster, "_cuts_on_arrival", lambda self, inst: False)
    slow = simulate_cluster(cfg, cc)
    pd.testing.assert_frame_equal(fast.table, slow.table)
    for i, ends in slow.iter_ends.items():
        np.testing.assert_array_equal(fast.iter_ends[i], ends)
    for k in ("iterations", "holds", "failovers", "finished", "ttft_p99", "tpot_p99"):
        assert fast.summary[k] == slow.summary[k], k
    assert fast.summary["scheduling_decisions"] < slow.summary["scheduling_decisions"]


def test_routers_that_read_progress_keep_every_cut() -> None:
    cc = ClusterConfig.load({"replicas": [{"count": 2}], "router": "jsq-tokens"})
    res = simulate_cluster(_cfg("vllm"), cc)
    assert res.cluster is not None
    assert all(
        inst.next_event == res.cluster.env.peek and not res.cluster._cuts_on_arrival(inst)
        for rep in res.cluster.replicas
        for inst in rep.incarnations
    )


def test_request_table_is_the_same_in_any_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    # Failovers (client timelines with streamed tokens) and horizon aborts (in-flight QoE).
    cc = ClusterConfig.load(
        {
            "replicas": [{"count": 2}],
            "router": "round-robin",
            "failures": [{"replica": 0, "at_s": 5.0, "recover_s": 8.0}],
        }
    )
    res = simulate_cluster(_cfg("sarathi", rate=30, horizon=15.0), cc)
    assert res.summary["aborted"] > 0 and res.summary["failovers"] > 0
    ends = {**res.iter_ends, -1: np.empty(0)}
    whole = summary_mod.request_table(res.requests, ends)
    monkeypatch.setattr(summary_mod, "_CHUNK", 7)
    chunked = summary_mod.request_table(res.requests, ends)
    pd.testing.assert_frame_equal(whole, chunked)
    # Each row's timeline numbers are those of the request's own token times.
    for r, row in zip(res.requests[:200], whole.itertuples(index=False), strict=False):
        t = summary_mod.token_times(r, ends[r.instance_id])
        if t.size > 1:
            assert row.ttft_s == float(t[0]) - r.arrival
            assert row.max_gap_s == float(np.max(np.diff(t)))
            assert row.tpot_s == (float(t[-1]) - float(t[0])) / (t.size - 1)


def test_delivered_qoe_is_andes_qoe_exactly() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(0, 400))
        d = 0.3 + np.cumsum(rng.exponential(0.05, size=n))
        arrival = float(rng.uniform(0.0, 0.5))
        ttft, tps = float(rng.uniform(0.0, 2.0)), float(rng.uniform(1.0, 30.0))
        assert delivered_qoe(arrival, d, ttft, tps) == andes_qoe(arrival, d, ttft, tps)
    with pytest.raises(ValueError, match="tokens_per_s"):
        delivered_qoe(0.0, np.ones(3), 1.0, 0.0)


def test_kv_shrink_gives_back_exactly_what_growing_took() -> None:
    from sloserve.engine.kv import KVInvariantError, PagedKVManager

    a, b = PagedKVManager(64, block_size=16), PagedKVManager(64, block_size=16)
    for kv in (a, b):
        kv.allocate(1, 30)
        kv.allocate(2, 16)
    a.grow_many([1, 2], 40)
    a.shrink(1, 37)
    a.shrink(2, 37)
    b.grow_many([1, 2], 3)
    a.check_invariants()
    assert (a.num_free_blocks, a.num_tokens(1), a.num_tokens(2)) == (
        b.num_free_blocks,
        b.num_tokens(1),
        b.num_tokens(2),
    )
    assert [a.num_request_blocks(r) for r in (1, 2)] == [b.num_request_blocks(r) for r in (1, 2)]
    with pytest.raises(KVInvariantError):
        a.shrink(1, 1000)


def test_run_until_prices_exactly_as_the_array_form() -> None:
    from sloserve.costmodel.base import BatchStats
    from sloserve.costmodel.profile import load_profile
    from sloserve.engine.fastpath import accumulate

    cm = load_profile("llama-2-70b-a100x2").cost_model()
    rng = np.random.default_rng(3)
    for _ in range(200):
        nd, npf = int(rng.integers(0, 40)), int(rng.integers(0, 3)) * int(rng.integers(1, 900))
        if nd + npf == 0:
            continue
        stats = BatchStats(
            num_prefill_tokens=npf,
            num_prefill_seqs=1 if npf else 0,
            prefill_attn_work=npf * (npf + int(rng.integers(0, 2000))) if npf else 0,
            num_decode=nd,
            decode_context_sum=nd * int(rng.integers(1, 4000)),
        )
        step, now, k = npf * npf, float(rng.uniform(0, 1e4)), int(rng.integers(1, 80))
        durs = cm.run_times(stats, k, step)
        ends = accumulate(now, durs)
        assert ends.tolist() == np.cumsum(np.concatenate(([now], durs)))[1:].tolist()
        t_next = float(ends[int(rng.integers(0, k))]) if rng.random() < 0.7 else float("inf")
        d, e = cm.run_until(stats, now, t_next, k, step)
        stop = int(np.searchsorted(ends, t_next, side="left")) + 1
        assert e == ends[: min(k, stop)].tolist() and d == durs[: len(e)].tolist()


def test_batch_time_is_the_models_expression() -> None:
    from sloserve.costmodel.base import BatchStats
    from sloserve.costmodel.profile import load_profile

    cm = load_profile("llama-2-70b-a100x2").cost_model()
    rng = np.random.default_rng(5)
    for _ in range(300):
        nd, npf = int(rng.integers(0, 40)), int(rng.integers(0, 3)) * int(rng.integers(1, 900))
        stats = BatchStats(
            num_prefill_tokens=npf,
            num_prefill_seqs=int(rng.integers(1, 3)) if npf else 0,
            prefill_attn_work=npf * (npf + int(rng.integers(0, 2000))),
            num_decode=nd,
            decode_context_sum=nd * int(rng.integers(1, 4000)),
        )
        t = cm.batch_time(stats)  # twice: the shape's constants are then cached
        assert t == cm.batch_time(stats)
        if nd + npf:
            ref = float(cm._time(stats, stats.decode_context_sum, stats.prefill_attn_work))
            assert t == ref == float(cm.run_times(stats, 1)[0])
        else:
            assert t == 0.0


def test_run_until_follows_replaced_coefficients() -> None:
    from sloserve.costmodel.base import BatchStats
    from sloserve.costmodel.profile import load_profile

    cm = load_profile("llama-2-70b-a100x2").cost_model()
    stats = BatchStats(num_prefill_tokens=0, num_decode=12, decode_context_sum=9000)
    first = cm.run_until(stats, 0.0, float("inf"), 5)
    assert cm.run_until(stats, 0.0, float("inf"), 5) == first  # the shape's cached constants
    cm.c = cm.c.model_copy(update={"intercept": cm.c.intercept + 0.01})
    again = cm.run_until(stats, 0.0, float("inf"), 5)
    assert again[0] == cm.run_times(stats, 5).tolist() and again != first


def test_chunked_delivered_qoe_is_delivered_qoe(monkeypatch: pytest.MonkeyPatch) -> None:
    res = simulate_cluster(_cfg("vllm", rate=30), ClusterConfig())
    ends = {**res.iter_ends, -1: np.empty(0)}
    monkeypatch.setattr(summary_mod, "_QOE_CHUNK", 5)
    table = summary_mod.request_table(res.requests, ends)
    checked = 0
    for r, q in zip(res.requests, table["qoe"], strict=True):
        if r.qoe is not None and r.status.name == "FINISHED":
            t = summary_mod.token_times(r, ends[r.instance_id])
            assert q == delivered_qoe(r.arrival, t, r.qoe.ttft_s, r.qoe.tokens_per_s)
            checked += 1
    assert checked > 100
