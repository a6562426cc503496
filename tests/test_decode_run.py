"""A run of decodes carried through a finish (``engine/decode_run.py``): the decision after
it takes the policy's promised answer without calling the policy, and nothing else moves.
Every request's tokens, the iteration log, the trace rows, the busy time, KV usage and
``busy_until`` seen mid-run are those of the engine asking the policy, with arrivals
cutting runs (a cluster's fast path), aborts and a horizon; the finished request is
retired at its own instant; the requests' token times are those of single steps."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import (
    count_schedule_calls,
    drive,
    make_drawn_instance,
    make_instance,
    outcome,
    req,
    router_probe,
    small_linear_cost,
    times,
)
from sloserve.core.errors import SchedulerViolation
from sloserve.core.request import Request, RequestStatus
from sloserve.costmodel.base import ConstantCostModel
from sloserve.engine import decode_run
from sloserve.engine.env import PRIO_ARRIVAL
from sloserve.engine.instance import Instance
from sloserve.engine.interface import InstanceView, SchedulerOutput
from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler


def _simulate(
    setup: dict[str, Any],
    spec: list[tuple[float, int, int]],
    *,
    promise: bool = True,
    checks: bool = False,
    multi_step: bool = True,
    probes: list[float] = (),  # type: ignore[assignment]
    aborts: list[tuple[float, int]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """One run; ``promise`` False asks the policy at every decision (the engine before);
    ``checks``: the engine's invariant checks (the policy is then asked anyway and its
    answer compared with the promised one)."""
    params = {"watermark": setup["watermark"], "preemption_mode": setup["mode"]}
    cost = small_linear_cost() if setup["cost"] == "linear" else ConstantCostModel(0.01)
    inst = make_drawn_instance(
        setup["policy"],
        setup,
        cost,
        params,
        multi_step=multi_step,
    )
    inst.debug_checks = checks
    assert inst.scheduler.repeats_decode_run
    if not promise:
        inst.scheduler.repeats_decode_run = False
    calls = count_schedule_calls(inst.scheduler)
    env = inst.env
    reqs = [req(i, a, p, o) for i, (a, p, o) in enumerate(sorted(spec))]
    done_at: dict[int, float] = {}
    inst.on_done = lambda r: done_at.setdefault(r.req_id, env.now)
    seen: list[tuple[float, int, float, int]] = []
    drive(
        inst,
        reqs,
        cut=setup["cut"],
        horizon=setup["horizon"],
        probe=router_probe(inst, seen),
        probes=probes,
        aborts=aborts,
    )
    for r in reqs:  # a finished request left at its own instant, its last token's end
        if r.status is RequestStatus.FINISHED:
            assert done_at[r.req_id] == r.finish_time == inst.iter_end[r.token_runs[-1]]
    return {
        **outcome(inst, reqs),
        "done_at": done_at,
        "times": [times(inst, r) for r in reqs],
        "kv": inst.kv.num_used_blocks,
        "probes": seen,
        "calls": calls[0],
    }


workloads = st.lists(
    st.tuples(st.floats(0, 0.8), st.integers(1, 120), st.integers(1, 40)), min_size=1, max_size=12
)
setups = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(["vllm", "vllm-hy", "sarathi", "sarathi-nocp", "sarathi-nohy"]),
        "watermark": st.sampled_from([0.0, 0.01, 0.1]),
        "mode": st.sampled_from(["recompute", "swap"]),
        "cost": st.sampled_from(["constant", "linear"]),
        "M": st.integers(40, 600),
        "C": st.integers(130, 256),
        "P": st.integers(4, 130),
        "R_max": st.integers(1, 8),
        "block_size": st.sampled_from([1, 4, 16]),
        "cut": st.booleans(),
        "horizon": st.none() | st.floats(0.05, 1.5),
    }
)


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for x, y in zip(a["times"], b["times"], strict=True):
        np.testing.assert_array_equal(x, y)
    skip = {"times", "calls"}
    assert {k: v for k, v in a.items() if k not in skip} == {
        k: v for k, v in b.items() if k not in skip
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=workloads,
    setup=setups,
    probes=st.lists(st.floats(0, 1.5), max_size=12),
    aborts=st.lists(st.tuples(st.floats(0, 1.0), st.integers(0, 11)), max_size=2),
)
def test_promised_decode_runs_change_only_the_policy_calls(
    spec: list[tuple[float, int, int]],
    setup: dict[str, Any],
    probes: list[float],
    aborts: list[tuple[float, int]],
) -> None:
    on = _simulate(setup, spec, probes=probes, aborts=aborts)
    off = _simulate(setup, spec, promise=False, probes=probes, aborts=aborts)
    # With the invariant checks the policy is asked anyway and must give the promised batch.
    checked = _simulate(setup, spec, checks=True, probes=probes, aborts=aborts)
    assert on["calls"] <= off["calls"]
    _same(on, off)  # trace rows, iteration ends, busy time: the same floats
    _same(checked, off)
    if not aborts and setup["horizon"] is None:
        # and the requests' token times are those of one iteration at a time
        single = _simulate(setup, spec, multi_step=False)
        assert [r[:4] for r in single["requests"]] == [r[:4] for r in on["requests"]]


_PLAIN = {
    "policy": "vllm",
    "watermark": 0.0,
    "mode": "recompute",
    "cost": "linear",
    "M": 10_000,
    "C": 256,
    "P": 256,
    "R_max": 8,
    "block_size": 4,
    "cut": False,
    "horizon": None,
}


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_each_finish_ends_a_run_and_the_next_is_not_asked(policy: str) -> None:
    # Four requests decode together and finish one by one (10, 20, 30, 40 tokens): after
    # each of the first three finishes, the remaining decodes run on without a policy call.
    spec = [(0.0, 8, 10), (0.0, 8, 20), (0.0, 8, 30), (0.0, 8, 40)]
    setup = {**_PLAIN, "policy": policy}
    on = _simulate(setup, spec)
    off = _simulate(setup, spec, promise=False)
    assert off["calls"] - on["calls"] == 3
    _same(on, off)
    tr = on["trace"]
    # the runs after the finishes: 3, 2, 1 decodes of 10 iterations (the last one each)
    assert [(b, s) for b, s in zip(tr["batch_size"], tr["steps"], strict=True)][-3:] == [
        (3, 10),
        (2, 10),
        (1, 10),
    ]
    assert [on["done_at"][i] for i in range(4)] == [on["requests"][i][3] for i in range(4)]


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_single_steps_of_decodes_are_promised_too(policy: str) -> None:
    # One iteration at a time: a single step of decodes only makes its whole batch the
    # continuation (decode_run.whole), so every later decode step is promised, not asked,
    # and nothing else changes.
    spec = [(0.0, 8, 10), (0.0, 8, 20), (0.01, 8, 30), (0.2, 8, 40)]
    setup = {**_PLAIN, "policy": policy}
    on = _simulate(setup, spec, multi_step=False)
    off = _simulate(setup, spec, multi_step=False, promise=False)
    checked = _simulate(setup, spec, multi_step=False, checks=True)
    _same(on, off)
    _same(checked, off)
    # (asked at every iteration, and once more to find nothing left)
    assert off["calls"] == len(off["iter_end"]) + 1 and on["calls"] < off["calls"] // 2


def test_not_taken_with_a_request_waiting_or_blocks_short() -> None:
    inst: Instance = make_instance("vllm", M=64, block_size=4)
    inst.debug_checks = False
    seen: list[bool] = []

    def at_finish(r: Request) -> None:  # called as request 0 leaves, before the decision
        cont = inst._cont
        if r.req_id != 0 or cont is None:
            return
        assert len(cont.entries) == len(inst.running) == 1
        seen.append(decode_run.repeat(inst, cont) is not None)
        inst.waiting.append(req(9, 0.0, 4, 4))
        seen.append(decode_run.repeat(inst, cont) is None)  # a waiting prompt may join
        inst.waiting.clear()
        kv = inst.kv
        free = kv.num_free_blocks
        assert kv.allocate(99, free * kv.block_size) is not None and not kv.num_free_blocks
        seen.append(decode_run.repeat(inst, cont) is None)  # no free block: it may evict
        kv.free(99)
        assert kv.num_free_blocks == free

    inst.on_done = at_finish
    for r in (req(0, 0.0, 8, 3), req(1, 0.0, 8, 30)):
        inst.env.schedule(0.0, lambda r=r: inst.add_request(r), PRIO_ARRIVAL)
    inst.env.run()
    assert seen == [True, True, True]


def test_the_flag_only_where_proven() -> None:
    for name in ("vllm", "vllm-hy", "sarathi", "sarathi-nocp", "sarathi-nohy"):
        assert make_instance(name).scheduler.repeats_decode_run, name
    for name in ("vllm-ef", "sarathi-ef", "edf", "qlm", "rank-input", "andes", "bros", "rr"):
        assert not make_instance(name).scheduler.repeats_decode_run, name
    assert not make_instance("vllm", params={"order": "priority"}).scheduler.repeats_decode_run

    class Stateful(UnifiedScheduler):  # overrides schedule: its own state is not proven
        def schedule(self, view: InstanceView) -> SchedulerOutput:
            return super().schedule(view)

    assert not Stateful("x", UnifiedConfig()).repeats_decode_run


def test_a_broken_promise_is_caught_under_invariant_checks() -> None:
    class Flipping(UnifiedScheduler):
        """Promises the decode run again but flips the decodes' order at every call."""

        flip = False

        def schedule(self, view: InstanceView) -> SchedulerOutput:
            out = super().schedule(view)
            self.flip = not self.flip
            if self.flip and out.repeatable:
                return dataclasses.replace(out, batch=out.batch[::-1])
            return out

    sched = Flipping("flipping", UnifiedConfig())
    sched.repeats_decode_run = True  # a false promise
    inst = make_instance(sched, cost=small_linear_cost(), C=256, block_size=4)
    reqs = [req(0, 0.0, 8, 10), req(1, 0.0, 8, 20), req(2, 0.0, 8, 30)]
    for r in reqs:
        inst.env.schedule(0.0, lambda r=r: inst.add_request(r), PRIO_ARRIVAL)
    with pytest.raises(SchedulerViolation, match="repeats_decode_run"):
        inst.env.run()


@pytest.mark.parametrize(
    "cluster",
    [
        {"replicas": [{"count": 3}], "router": "least-outstanding"},  # arrivals cut runs
        {"replicas": [{"count": 3}], "router": "least-loaded"},  # reads KV mid-run
        {
            "replicas": [{"count": 3}],
            "router": "least-outstanding",
            "router_params": {"max_outstanding": 5},  # finishes pull held requests
            "failures": [{"replica": 1, "at_s": 4.0, "recover_s": 7.0}],
        },
    ],
)
@pytest.mark.parametrize(("policy", "kv_tokens"), [("vllm", None), ("sarathi", 3000)])
def test_cluster_runs_are_the_same_with_promised_decode_runs(
    cluster: dict[str, Any], policy: str, kv_tokens: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd

    from sloserve.cluster import ClusterConfig
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import InstanceConfig, SimConfig
    from sloserve.workloads import PoissonArrivals, WorkloadSpec

    w = WorkloadSpec(mix="sharegpt", arrival=PoissonArrivals(rate=12.0), duration_s=12, seed=7)
    icfg = InstanceConfig(max_running=24, chunk_size=64, kv_capacity_tokens=kv_tokens)
    cfg = SimConfig(workload=w, instance=icfg, policy=policy, horizon_s=14.0)
    cc = ClusterConfig.load(cluster)
    taken = [0]
    real = decode_run.repeat

    def counted(inst: Instance, cont: Any) -> Any:
        out = real(inst, cont)
        taken[0] += out is not None
        return out

    monkeypatch.setattr(decode_run, "repeat", counted)
    on = simulate_cluster(cfg, cc)
    assert taken[0] > 0
    monkeypatch.setattr(decode_run, "repeat", lambda inst, cont: None)
    off = simulate_cluster(cfg, cc)
    pd.testing.assert_frame_equal(on.table, off.table)
    pd.testing.assert_frame_equal(on.trace, off.trace)
    for i, ends in off.iter_ends.items():
        np.testing.assert_array_equal(on.iter_ends[i], ends)
    drop = {"wall_seconds"}
    assert {k: v for k, v in on.summary.items() if k not in drop} == {
        k: v for k, v in off.summary.items() if k not in drop
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.lists(
        st.tuples(
            st.floats(0, 1),
            st.integers(1, 60),
            st.integers(1, 30),
            st.lists(st.integers(0, 2), min_size=1, max_size=8),
        ),
        min_size=1,
        max_size=12,
    ),
    policy=st.sampled_from(["vllm", "sarathi", "vllm-hy"]),
    blocks=st.integers(16, 64),
)
def test_promised_decode_runs_with_prefix_caching(
    spec: list[tuple[float, int, int, list[int]]], policy: str, blocks: int
) -> None:
    # Shared prompt prefixes on the prefix-caching manager (hits, evictions, a tight cache):
    # the promise taken or refused, every request's tokens and times the same.
    from sloserve.core.predictor import make_predictor
    from sloserve.engine.env import Environment
    from sloserve.engine.interface import Limits
    from sloserve.engine.prefix_cache import PrefixCachingKVManager
    from sloserve.policies.registry import make_policy

    def serve(promise: bool) -> tuple[list[Any], list[float], dict[str, list[Any]], int]:
        env = Environment()
        kv = PrefixCachingKVManager(blocks, 4, 16, source_block_tokens=8)
        sched = make_policy(policy)
        sched.repeats_decode_run = promise
        inst = Instance(
            env, sched, small_linear_cost(), Limits(256, 256, blocks * 4, 4, 4),
            make_predictor("oracle"), kv=kv, cpu_swap_blocks=16,
        )  # fmt: skip
        calls = count_schedule_calls(sched)
        reqs = [Request(i, a, p, o, hash_ids=tuple(h)) for i, (a, p, o, h) in enumerate(spec)]
        for r in reqs:
            env.schedule(r.arrival, lambda r=r: inst.add_request(r), PRIO_ARRIVAL)
        env.run()
        rows = [
            (r.status, list(r.token_runs), r.finish_time, r.num_cached_tokens, r.num_preemptions)
            for r in reqs
        ]
        return rows, list(inst.iter_end), dataclasses.asdict(inst.trace), calls[0]

    on, off = serve(True), serve(False)
    assert on[:3] == off[:3]
    assert on[3] <= off[3]
