"""Andes and LQSF: QoE prediction, the Figure 8 example, solvers and objectives end to end,
and a cyclic-burst comparison with vLLM and LQSF."""

from typing import Any

import numpy as np
import pytest

from helpers import make_instance, req, run, times
from sloserve.core.errors import ConfigError
from sloserve.core.request import QoESpec, Request, RequestStatus
from sloserve.costmodel.base import ConstantCostModel
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel
from sloserve.engine.interface import InstanceView, Scheduler, SchedulerOutput
from sloserve.metrics.qoe import andes_qoe, consumption_times
from sloserve.metrics.summary import token_times
from sloserve.policies.andes import (
    AndesConfig,
    AndesScheduler,
    LQSFConfig,
    LQSFScheduler,
    MaxMinQoE,
    ObjectiveContext,
    PerfectQoECount,
    make_andes,
    make_lqsf,
    predict_qoe,
)


def qoe_of(inst: Any, r: Request) -> float:
    assert r.qoe is not None
    return andes_qoe(r.arrival, times(inst, r), r.qoe.ttft_s, r.qoe.tokens_per_s)


# ------------------------------------------------------------------------- QoE prediction
def test_predicted_qoe_is_andes_qoe_of_the_predicted_timeline() -> None:
    rng = np.random.default_rng(0)
    for _ in range(2000):
        arrival = rng.uniform(0, 5)
        ttft = float(rng.choice([0.0, 0.5, 1.0, 2.0]))
        s = float(rng.choice([1.0, 2.0, 3.3, 4.8, 10.0]))
        n = int(rng.integers(0, 8))
        d = arrival + rng.uniform(0, 2) + np.cumsum(rng.exponential(rng.choice([0.05, 1.0]), n))
        now = (d[-1] if n else arrival) + rng.uniform(0, 2)
        total = n + int(rng.integers(1, 30))
        t_end = now + float(rng.choice([0.5, 1.0, 2.0, 5.0]))
        tau = float(rng.choice([0.01, 0.1, 0.5, 1.0, 1 / s]))
        first = now + float(rng.choice([0.0, 0.05, 0.5, 3.0, np.inf])) + tau * (rng.random() < 0.5)
        a = consumption_times(arrival, d, ttft, s)
        q = predict_qoe(
            np.array([float(n)]),
            np.array([a[-1] if n else 0.0]),
            np.array([a.sum()]),
            np.array([arrival + ttft]),
            np.array([1 / s]),
            np.array([float(total)]),
            t_end,
            np.array([first]),
            tau,
        )[0]
        new = np.empty(0)
        if np.isfinite(first) and t_end >= first:
            k = min(int(np.floor((t_end - first) / tau + 1e-9)) + 1, total - n)
            new = np.minimum(first + np.arange(k) * tau, t_end)  # float noise at t_end
        ref = andes_qoe(arrival, np.concatenate([d, new]), ttft, s, now=t_end, total_tokens=total)
        assert q == pytest.approx(ref, abs=1e-7)


def test_tracker_follows_the_real_consumption_timeline() -> None:
    """The incremental per-request state equals the pacer recurrence over the real token
    times, also across fast-forwarded runs of the vLLM fallback (multi_step)."""
    sched = AndesScheduler()
    inner = sched.schedule
    checked = 0

    def check(view: InstanceView) -> SchedulerOutput:
        nonlocal checked
        out = inner(view)
        tr = sched.tracker
        for r in view.running:
            s = tr.index[r.req_id]
            t = token_times(r, np.asarray(view.iter_end))
            assert tr.n[s] == t.size == r.num_output_tokens
            if t.size:
                assert r.qoe is not None
                a = consumption_times(r.arrival, t, r.qoe.ttft_s, r.qoe.tokens_per_s)
                assert tr.a_last[s] == pytest.approx(a[-1], abs=1e-9)
                assert tr.sum_a[s] == pytest.approx(a.sum(), abs=1e-6)
                checked += 1
        return out

    sched.schedule = check  # type: ignore[method-assign]
    rng = np.random.default_rng(4)
    reqs = [
        req(i, float(rng.uniform(0, 3)), int(rng.integers(5, 40)), int(rng.integers(5, 80)),
            qoe=QoESpec(1.0, float(rng.choice([2.0, 5.0]))))
        for i in range(30)
    ]  # fmt: skip
    run(make_instance(sched, M=600, block_size=4, R_max=12), reqs)
    assert checked > 100
    assert all(r.status is RequestStatus.FINISHED for r in reqs)


# ------------------------------------------------------------------------- Figure 8
def _figure8() -> list[Request]:
    # R1: long context, slow reader (3 tokens/s): it builds a large buffer at 10 tokens/s.
    # R2, R3: short prompts, faster readers. R4, R5 arrive at t = 3 when the KV cache
    # (M = 180 tokens) cannot hold them next to R1, R2, R3 (90 + 40 + 40 tokens).
    return [
        req(1, 0.0, 60, 60, qoe=QoESpec(1.0, 3.0)),
        req(2, 0.0, 10, 100, qoe=QoESpec(1.0, 4.0)),
        req(3, 0.0, 10, 100, qoe=QoESpec(1.0, 4.0)),
        req(4, 3.0, 20, 20, qoe=QoESpec(1.0, 2.0)),
        req(5, 3.0, 20, 20, qoe=QoESpec(1.0, 2.0)),
    ]


@pytest.mark.parametrize("multi_step", [True, False])
def test_figure8_buffered_long_request_yields_to_new_arrivals(multi_step: bool) -> None:
    inst = make_instance(
        AndesScheduler(), cost=ConstantCostModel(0.1), M=180, block_size=1, multi_step=multi_step
    )
    r1, r2, r3, r4, r5 = reqs = _figure8()
    run(inst, reqs)
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
    t1 = times(inst, r1)
    # one prefill iteration, then a token every 0.1 s until the new arrivals at t = 3
    np.testing.assert_allclose(t1[:30], 0.1 * np.arange(1, 31))
    # at t = 3 R1 (lowest priority: 30 tokens delivered, 5 read, the longest context) is
    # preempted and R4, R5 are admitted: both get their first token after one prefill
    assert times(inst, r4)[0] == pytest.approx(3.1)
    assert times(inst, r5)[0] == pytest.approx(3.1)
    assert r1.num_preemptions >= 1 and t1[30] > 5.0
    # ... and R1 is resumed (preempting others) before its reader runs out of tokens:
    # token 31 is due at T_31 = 1 + 30/3 = 11 s; the consumption timeline never stalls
    assert t1[30] < 11.0
    a1 = consumption_times(0.0, t1, 1.0, 3.0)
    np.testing.assert_allclose(a1, 1.0 + np.arange(60) / 3.0)
    assert r2.num_preemptions + r3.num_preemptions >= 1
    for r in reqs:
        assert qoe_of(inst, r) == pytest.approx(1.0)

    # vLLM (FCFS) keeps R1 running; R4 and R5 wait ~3 s for memory and lose QoE
    fcfs = make_instance("vllm", cost=ConstantCostModel(0.1), M=180, block_size=1)
    v1, _v2, _v3, v4, v5 = vreqs = _figure8()
    run(fcfs, vreqs)
    assert v1.num_preemptions == 0
    assert times(fcfs, v4)[0] - 3.0 > 3.0 and times(fcfs, v5)[0] - 3.0 > 3.0
    assert qoe_of(fcfs, v4) < 0.75 and qoe_of(fcfs, v5) < 0.75


# ------------------------------------------------------------------------- end to end
def _small_workload(seed: int = 0, n: int = 60) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [
        req(i, float(rng.uniform(0, 6)), int(rng.integers(5, 60)), int(rng.integers(5, 60)),
            qoe=QoESpec(float(rng.choice([0.5, 1.0])), float(rng.choice([3.0, 6.0, 10.0]))))
        for i in range(n)
    ]  # fmt: skip


# 10 ms per iteration, 0.5 ms per token, 2 ms per decoding request: a batch of 16 decodes
# takes 50 ms (20 tokens/s each), below the fastest readers' 10 tokens/s only for B < 8,
# so the batch-size search has a real range. Swaps: 1 µs per KV token.
_COST = LinearCostModel(
    LinearCoefficients(intercept=0.01, per_token=0.0005, per_decode_seq=0.002),
    kv_bytes_per_token=1000,
    swap_bytes_per_s=1e9,
)


@pytest.mark.parametrize(
    "params",
    [
        {"objective": "avg", "solver": "greedy"},
        {"objective": "avg", "solver": "dp", "dp_memory_units": 64},
        {"objective": "max-min", "solver": "greedy"},
        {"objective": "max-min", "solver": "dp"},
        {"objective": "perfect", "solver": "greedy"},
        {"objective": "perfect", "solver": "dp"},
        {"refiner": False},
        {"selective": False, "hybrid": True},
        {"preemption_mode": "swap"},
        {"preemption_mode": "recompute", "delta_t": 3.0},
        {"batch_min": 2, "batch_max": 6, "batch_candidates": 3},
    ],
)
def test_andes_variants_run_without_engine_violations(params: dict[str, Any]) -> None:
    sched = make_andes(params)
    assert isinstance(sched, AndesScheduler)
    inst = make_instance(sched, cost=_COST, M=400, block_size=4, cpu_blocks=30, R_max=16)
    reqs = _small_workload()
    run(inst, reqs)  # the engine validates every output and checks KV invariants
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
    q = [qoe_of(inst, r) for r in reqs]
    assert all(0.0 <= x <= 1.0 for x in q)
    assert sched.stats["triggered"] > 0
    assert inst.kv.num_used_blocks == 0 and inst.kv.cpu.used_blocks == 0  # type: ignore[attr-defined]
    if params.get("preemption_mode") == "swap":
        assert inst.num_swaps > 0


def test_objectives_steer_toward_their_goal() -> None:
    """On the same overloaded workload: the perfect-count objective yields the most
    perfect-QoE requests, max-min lifts the worst QoE far above vLLM's, and average QoE
    beats vLLM's average."""
    results: dict[str, tuple[float, float, float]] = {}
    for name, sched in [
        ("avg", AndesScheduler(AndesConfig(objective="avg"))),
        ("perfect", AndesScheduler(AndesConfig(objective="perfect"))),
        ("max-min", AndesScheduler(AndesConfig(objective="max-min"))),
        ("vllm", "vllm"),
    ]:
        inst = make_instance(sched, cost=_COST, M=400, block_size=4, R_max=16)
        reqs = _small_workload()
        run(inst, reqs)
        q = np.array([qoe_of(inst, r) for r in reqs])
        results[name] = (float(q.mean()), float((q >= 1 - 1e-9).mean()), float(q.min()))
    # measured (mean, perfect fraction, min): avg 0.848 / 0.117 / 0.662; perfect 0.802 /
    # 0.517 / 0.081; max-min 0.748 / 0.133 / 0.602; vllm 0.726 / 0.233 / 0.123
    assert results["perfect"][1] > results["avg"][1] + 0.3
    assert results["perfect"][1] > results["vllm"][1] + 0.2
    assert results["max-min"][2] > results["vllm"][2] + 0.3
    assert results["avg"][0] > results["vllm"][0] + 0.08


def test_objective_gain_functions() -> None:
    q_serve = np.array([1.0, 0.9, 0.5, 1.0])
    q_wait = np.array([0.8, 0.4, 0.3, 1.0])
    q_now = np.array([1.0, 0.95, 0.6, 1.0])
    ctx = ObjectiveContext(q_now, float(q_now.min()))  # Q_min = 0.6
    mm = MaxMinQoE()
    gain = mm.value(q_serve, ctx) - mm.value(q_wait, ctx)
    # Equation 7, max(Q_min − Q_wait, 0), where serving keeps Q >= Q_min (all but index 2)
    np.testing.assert_allclose(gain[[0, 1, 3]], np.maximum(0.6 - q_wait[[0, 1, 3]], 0.0))
    pc = PerfectQoECount()
    gain = pc.value(q_serve, ctx) - pc.value(q_wait, ctx)
    # Equation 8: [1(Q_serve = 1) − 1(Q_wait = 1)]·1(Q_now = 1)
    np.testing.assert_allclose(gain, [1.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("policy", ["andes", "lqsf", "lqsf-preemptive"])
def test_fast_path_does_not_change_decisions(policy: str) -> None:
    def make() -> Scheduler:
        if policy == "andes":
            return AndesScheduler()
        return LQSFScheduler(LQSFConfig(preempt_for_waiting=policy == "lqsf-preemptive"))

    out = []
    for multi_step in (True, False):
        inst = make_instance(
            make(), cost=_COST, M=400, block_size=4, R_max=16, multi_step=multi_step
        )
        reqs = _small_workload(seed=2)
        run(inst, reqs)
        out.append([times(inst, r).tolist() for r in reqs])
    assert out[0] == out[1]


def test_compute_bound_trigger_searches_batch_sizes() -> None:
    # 48 decodes take 10 + 0.5·48 + 2·48 = 130 ms: slower than the readers' 10 tokens/s
    # (100 ms), though the KV cache is nearly empty; B <= 36 would be fast enough.
    sched = AndesScheduler()
    inst = make_instance(sched, cost=_COST, M=100_000, R_max=64)
    reqs = [req(i, 0.0, 20, 40, qoe=QoESpec(1.0, 10.0)) for i in range(48)]
    run(inst, reqs)
    assert sched.stats["triggered"] > 0 and sched.stats["batch_search"] > 0
    trace = inst.trace
    decode_batches = [
        b for b, t in zip(trace.batch_size, trace.batch_tokens, strict=True) if b == t
    ]
    assert min(decode_batches) < 48  # the knapsack chose a smaller batch at least once
    assert all(r.status is RequestStatus.FINISHED for r in reqs)


def test_factories_validate_parameters() -> None:
    assert isinstance(make_andes({}), AndesScheduler)
    assert make_andes({"objective": "average"}).describe()["objective"] == "avg"
    assert isinstance(make_lqsf({"delta_t": 2.0}), LQSFScheduler)
    for bad in (
        {"delta": 1.0},
        {"delta_t": 0},
        {"solver": "ilp"},
        {"objective": "median"},
        {"watermark": 1.5},
        {"batch_min": 8, "batch_max": 4},
        {"batch_min": 0},
        {"preemption_mode": "drop"},
        {"dp_memory_units": 0},
    ):
        with pytest.raises(ConfigError):
            make_andes(bad)
    for bad in ({"refiner": True}, {"delta_t": -1}, {"preemption_mode": "x"}, {"watermark": 2}):
        with pytest.raises(ConfigError):
            make_lqsf(bad)


# ------------------------------------------------------------------------- cyclic bursts
def test_cyclic_bursts_andes_beats_vllm_and_lqsf_and_refiner_limits_preemption() -> None:
    """Andes §6.3's cyclic burst pattern (intensity 2, 35% of each 60 s period) for one
    period on the llama-2-7b-a100 replica, ShareGPT lengths, Andes' QoE specs. 16 req/s is
    just above the replica's no-burst capacity (14-15 req/s measured in steady overload).
    R_max is raised to 1024 so that KV memory, not the 256-slot default, is the binding
    resource, as in the paper (with R_max = 256 the replica is slot-bound at ~50% KV).

    Measured, mean QoE over seeds 0 / 1: andes 0.954 / 0.997, lqsf 0.949 / 0.987, vllm
    0.868 / 0.957; preemptions per request with / without the refiner (seed 0): 0.34 /
    27.7 (QoE 0.954 / 0.381). Over seeds 0-4 Andes beats vLLM by +0.040 to +0.087 and
    LQSF by +0.0055 to +0.014 at this rate."""
    from sloserve.experiments.runner import InstanceConfig, SimConfig, compare
    from sloserve.policies.registry import policy_names, register
    from sloserve.workloads import BurstyArrivals, WorkloadSpec

    if "andes" not in policy_names():  # until the registry lists them itself
        register("andes", make_andes, "Andes: QoE-aware token-level preemption")
    if "lqsf" not in policy_names():
        register("lqsf", make_lqsf, "Least QoE Slack First")

    qoe: dict[str, list[float]] = {"vllm": [], "andes": [], "lqsf": []}
    for seed in (0, 1):
        cfg = SimConfig(
            workload=WorkloadSpec(
                arrival=BurstyArrivals(rate=16, intensity=2, burst_fraction=0.35, period_s=60),
                duration_s=60,
                seed=seed,
            ),
            instance=InstanceConfig(profile="llama-2-7b-a100", max_running=1024),
        )
        res = compare(cfg, ["vllm", "andes", "lqsf"])
        for name, r in res.items():
            assert r.summary["finished"] == r.summary["requests"]
            qoe[name].append(float(r.summary["qoe_mean"]))
        if seed == 0:
            andes0 = res["andes"].summary
            noref = compare(cfg.model_copy(update={"policy_params": {"refiner": False}}), ["andes"])
            off = noref["andes"].summary
    mean = {k: float(np.mean(v)) for k, v in qoe.items()}
    assert mean["andes"] > mean["vllm"] + 0.05
    assert mean["andes"] > mean["lqsf"] + 0.004
    assert all(a > v + 0.03 for a, v in zip(qoe["andes"], qoe["vllm"], strict=True))
    per_req = andes0["preemptions"] / andes0["requests"]
    per_req_off = off["preemptions"] / off["requests"]
    assert per_req < 0.25 * per_req_off
    assert andes0["qoe_mean"] > off["qoe_mean"] + 0.2


def test_andes_does_not_thrash_when_only_r_max_binds() -> None:
    """``sloserve demo``'s workload, shortened: bursty ShareGPT at 11 req/s on Llama-2-7B /
    A100 with the default R_max of 256. KV never reaches the watermark; the running requests
    fill the slots during bursts. The paper triggers Andes on memory or token latency only,
    so Andes must schedule as vLLM here. With the slot trigger on (the old default) it
    preempted 883 times in 120 s, and 9,013 times over the demo's 600 s (QoE 0.867 vs
    vLLM's 0.999)."""
    from sloserve.experiments.runner import InstanceConfig, SimConfig, compare
    from sloserve.workloads import BurstyArrivals, WorkloadSpec

    cfg = SimConfig(
        workload=WorkloadSpec(mix="sharegpt", arrival=BurstyArrivals(rate=11), duration_s=120),
        instance=InstanceConfig(profile="llama-2-7b-a100"),
    )
    res = compare(cfg, ["vllm", "andes"])
    andes, vllm = res["andes"].summary, res["vllm"].summary
    assert andes["preemptions"] == 0
    assert andes["qoe_mean"] == pytest.approx(vllm["qoe_mean"], abs=1e-9)
    assert andes["e2e_mean"] == pytest.approx(vllm["e2e_mean"], rel=1e-6)
    # the extension is still there when asked for, and it is what preempts
    slots = compare(cfg.model_copy(update={"policy_params": {"slot_trigger": True}}), ["andes"])
    assert slots["andes"].summary["preemptions"] > 100
