"""InferMax's CSP: exactness against exhaustive search, never worse than the presets, engine
replay of its schedules, the online variant, the options, and the §4.5 finding."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloserve.core.errors import ConfigError, SchedulerViolation
from sloserve.costmodel.base import ConstantCostModel
from sloserve.costmodel.profile import load_profile
from sloserve.engine.interface import Limits
from sloserve.optimal.infermax import (
    CspOptions,
    Job,
    Schedule,
    ScheduledBatch,
    SolverUnavailable,
    evaluate,
    exhaustive_optimum,
    read_schedule,
    replay,
    run_baseline,
    solve,
    uniform_jobs,
    write_schedule,
)

CM = load_profile("llama-2-7b-a100").cost_model()
FAST = {"workers": 1, "time_limit_s": 20.0, "warm_start": ()}

TINY = {
    "two-evict": ([Job(0, 3, 2), Job(1, 3, 2)], Limits(4096, 4096, 6, 8, 1)),
    "three-mixed": ([Job(0, 2, 3), Job(1, 4, 2), Job(2, 1, 2)], Limits(6, 4, 7, 8, 1)),
    "rmax": ([Job(0, 3, 2), Job(1, 2, 2), Job(2, 2, 3)], Limits(4096, 4096, 6, 2, 1)),
    "chunks": ([Job(0, 4, 2), Job(1, 4, 2)], Limits(4096, 2, 6, 8, 1)),
}


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


@pytest.mark.parametrize(
    ("case", "objective", "evict"),
    [
        ("two-evict", "latency", True),
        ("two-evict", "latency", False),
        ("two-evict", "makespan", True),
        ("three-mixed", "latency", True),
        ("three-mixed", "makespan", False),
        ("rmax", "latency", True),
        ("chunks", "latency", True),
    ],
)
def test_csp_equals_exhaustive_search(case: str, objective: str, evict: bool) -> None:
    jobs, limits = TINY[case]
    bf = exhaustive_optimum(jobs, limits, CM, objective=objective, allow_eviction=evict)
    # the same batch budget for both: then both are exact optima over the same schedules
    J = bf.schedule.num_batches + 1
    bf_j = exhaustive_optimum(
        jobs, limits, CM, objective=objective, allow_eviction=evict, max_batches=J
    )
    res = solve(
        jobs,
        limits,
        CM,
        CspOptions(objective=objective, allow_eviction=evict, max_batches=J, **FAST),  # type: ignore[arg-type]
    )
    assert res.status == "optimal"
    assert res.evaluation is not None
    assert _close(res.evaluation.metric(objective), bf_j.value)
    assert _close(bf_j.value, bf.value)  # one spare batch never helps on these
    assert res.objective is not None and _close(res.objective, bf.value, 1e-5)
    if not evict:
        assert res.evictions == 0


@st.composite
def _tiny(draw: st.DrawFn) -> tuple[list[Job], Limits]:
    n = draw(st.integers(2, 3))
    jobs = [Job(i, draw(st.integers(1, 4)), draw(st.integers(1, 3))) for i in range(n)]
    need = max(j.max_kv for j in jobs)
    m = draw(st.integers(need, sum(j.max_kv for j in jobs)))
    c = draw(st.integers(max(j.input_tokens for j in jobs), 8))
    p = draw(st.integers(1, c))
    return jobs, Limits(c, p, m, draw(st.integers(1, n)), 1)


@settings(
    max_examples=16, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(_tiny())
def test_csp_equals_exhaustive_search_on_random_instances(inst: tuple[list[Job], Limits]) -> None:
    jobs, limits = inst
    bf = exhaustive_optimum(jobs, limits, CM)
    J = bf.schedule.num_batches
    res = solve(jobs, limits, CM, CspOptions(max_batches=J, **FAST))  # type: ignore[arg-type]
    assert res.status == "optimal" and res.evaluation is not None
    assert _close(res.evaluation.total_latency, bf.value)
    # the exhaustive search's own schedule is what the engine does, too
    assert _close(replay(bf.schedule, jobs, CM, limits).total_latency, bf.value, 1e-12)


@pytest.mark.parametrize(("hybrid", "chunked"), [(False, True), (True, False), (False, False)])
def test_forbidden_features_match_exhaustive(hybrid: bool, chunked: bool) -> None:
    jobs, limits = TINY["three-mixed"]
    bf = exhaustive_optimum(jobs, limits, CM, allow_hybrid=hybrid, allow_chunked_prefill=chunked)
    J = bf.schedule.num_batches + 1
    res = solve(
        jobs,
        limits,
        CM,
        CspOptions(
            allow_hybrid=hybrid,
            allow_chunked_prefill=chunked,
            max_batches=J,
            **FAST,  # type: ignore[arg-type]
        ),
    )
    assert res.status == "optimal" and res.evaluation is not None
    assert _close(res.evaluation.total_latency, bf.value)
    free = exhaustive_optimum(jobs, limits, CM)
    assert bf.value >= free.value - 1e-12  # forbidding a feature never helps


def test_batches_sufficient_certifies_a_global_optimum() -> None:
    jobs, limits = TINY["two-evict"]
    res = solve(jobs, limits, CM, CspOptions(workers=1, time_limit_s=20))
    assert res.status == "optimal" and res.batches_sufficient is True
    assert res.latency is not None
    assert _close(res.latency, exhaustive_optimum(jobs, limits, CM).value)
    tight = solve(jobs, limits, CM, CspOptions(workers=1, time_limit_s=20, max_batches=2))
    assert tight.status == "infeasible" and tight.batches_sufficient is False


def test_evicting_optimum_beats_eviction_free_on_a_tiny_instance() -> None:
    jobs, limits = TINY["two-evict"]
    with_e = exhaustive_optimum(jobs, limits, CM)
    without = exhaustive_optimum(jobs, limits, CM, allow_eviction=False)
    assert with_e.schedule.evictions > 0 and with_e.value < without.value


PRESETS = [
    f"{p}{s}"
    for p in ("vllm", "sarathi", "sarathi-p=c", "sarathi-nocp", "vllm-hy", "sarathi-nohy")
    for s in ("", "-ef")
]


@pytest.mark.parametrize("online", [False, True])
def test_optimum_never_worse_than_any_preset(online: bool) -> None:
    from sloserve.policies.registry import policy_names

    jobs = uniform_jobs(3, 6, 3)
    if online:
        jobs = [Job(0, 6, 3), Job(1, 4, 2), Job(2, 6, 3, 0.005)]
    limits = Limits(4096, 4096, 14, 256, 1)
    # the Table 1 presets and every other registered policy that can serve the instance
    runs = {p: run_baseline(p, jobs, CM, limits) for p in sorted({*PRESETS, *policy_names()})}
    served = {p: b for p, b in runs.items() if b.evaluation is not None}
    assert set(PRESETS) <= set(served)
    res = solve(jobs, limits, CM, CspOptions(workers=1, time_limit_s=20, warm_start=tuple(served)))
    assert res.evaluation is not None and res.status in ("optimal", "feasible")
    for p, b in served.items():
        assert b.evaluation is not None
        assert res.evaluation.total_latency <= b.evaluation.total_latency * (1 + 1e-9), p


def test_replayed_schedule_passes_engine_validation_and_reproduces_objective(
    tmp_path: Path,
) -> None:
    jobs, limits = TINY["three-mixed"]
    res = solve(jobs, limits, CM, CspOptions(workers=1, time_limit_s=20))
    assert res.schedule is not None and res.evaluation is not None and res.objective
    run = replay(res.schedule, jobs, CM, limits)
    assert run.all_finished
    assert _close(run.total_latency, res.evaluation.total_latency, 1e-12)
    assert _close(run.total_latency, res.objective, 1e-6)
    assert run.num_preemptions == res.evaluation.evictions
    assert res.gap == 0.0 and res.bound is not None and res.bound <= res.objective * (1 + 1e-12)
    # the JSON form round-trips
    path = tmp_path / "s.json"
    write_schedule(path, res.schedule, jobs, limits, "llama-2-7b-a100")
    sched, jobs2, limits2, profile = read_schedule(path)
    assert sched.batches == res.schedule.batches and jobs2 == list(jobs)
    assert limits2 == limits and profile == "llama-2-7b-a100"


def test_engine_rejects_a_schedule_that_breaks_a_limit() -> None:
    jobs = [Job(0, 3, 2), Job(1, 3, 2)]
    limits = Limits(4096, 4096, 5, 8, 1)
    bad = Schedule((ScheduledBatch(((0, 3), (1, 3))),))  # 6 KV tokens > M = 5
    with pytest.raises(SchedulerViolation, match="M"):
        replay(bad, jobs, CM, limits)
    with pytest.raises(SchedulerViolation, match="M"):
        evaluate(bad, jobs, CM, limits)


def test_online_variant_respects_arrivals_and_replays() -> None:
    jobs = [Job(0, 4, 3, 0.0), Job(1, 2, 2, 0.015), Job(2, 3, 2, 0.1)]
    limits = Limits(4096, 4096, 8, 8, 1)
    res = solve(jobs, limits, CM, CspOptions(workers=1, time_limit_s=20))
    assert res.status == "optimal" and res.schedule is not None and res.evaluation is not None
    ev = res.evaluation
    for batch, start in zip(res.schedule.batches, ev.batch_start, strict=True):
        assert all(start >= jobs[r].arrival_s for r, _n in batch.entries)
    assert ev.first_token[2] > 0.1  # the GPU waited for request 2
    run = replay(res.schedule, jobs, CM, limits)
    assert _close(run.total_latency, ev.total_latency, 1e-12)
    for name, b in res.baselines.items():
        assert b.evaluation is not None
        assert ev.total_latency <= b.evaluation.total_latency * (1 + 1e-9), name


@pytest.mark.parametrize("objective", ["ttft", "tpot"])
def test_alternative_objectives(objective: str) -> None:
    jobs = [Job(0, 3, 3), Job(1, 2, 2), Job(2, 2, 3)]
    limits = Limits(4096, 4096, 7, 8, 1)
    res = solve(jobs, limits, CM, CspOptions(objective=objective, workers=1, time_limit_s=20))  # type: ignore[arg-type]
    lat = solve(jobs, limits, CM, CspOptions(objective="latency", workers=1, time_limit_s=20))
    assert res.status == "optimal" and res.evaluation is not None and res.objective is not None
    assert lat.evaluation is not None
    assert _close(res.objective, res.evaluation.metric(objective), 1e-5)
    assert res.evaluation.metric(objective) <= lat.evaluation.metric(objective) * (1 + 1e-9)
    for b in res.baselines.values():
        assert b.evaluation is not None
        assert res.evaluation.metric(objective) <= b.evaluation.metric(objective) * (1 + 1e-9)


def test_better_than_constraint() -> None:
    jobs, limits = TINY["two-evict"]
    ok = solve(jobs, limits, CM, CspOptions(better_than="vllm-ef", better_by_pct=10, **FAST))  # type: ignore[arg-type]
    assert ok.status == "optimal" and ok.target is not None and ok.latency is not None
    assert ok.latency <= ok.target * (1 + 1e-9)
    no = solve(jobs, limits, CM, CspOptions(better_than="vllm-ef", better_by_pct=50, **FAST))  # type: ignore[arg-type]
    assert no.status == "infeasible" and no.schedule is None and no.objective is None


def test_constant_cost_model_counts_batches() -> None:
    jobs = uniform_jobs(2, 2, 2)
    res = solve(jobs, Limits(4096, 4096, 100, 8, 1), ConstantCostModel(0.01), CspOptions(**FAST))  # type: ignore[arg-type]
    # both prefills in one batch, one decode batch: each request finishes at 2 × 10 ms
    assert res.status == "optimal" and res.latency == pytest.approx(0.04)


def test_bad_input_is_a_typed_error() -> None:
    with pytest.raises(ConfigError, match="M="):
        solve([Job(0, 10, 5)], Limits(4096, 4096, 8, 8, 1), CM)
    with pytest.raises(ConfigError, match="objective"):
        CspOptions(objective="fairness")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="block size"):
        solve([Job(0, 2, 2)], Limits(4096, 4096, 64, 8, 16), CM)


def test_missing_solver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ortools.sat.python.cp_model", None)
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    with pytest.raises(SolverUnavailable, match=r"sloserve\[solver\]"):
        solve([Job(0, 2, 2)], Limits(4096, 4096, 64, 8, 1), CM, CspOptions(warm_start=()))


def test_simulating_never_imports_the_solver() -> None:
    code = (
        "import sys, sloserve.cli, sloserve.optimal, sloserve.optimal.infermax, "
        "sloserve.experiments.infermax.csp\n"
        "from sloserve.experiments.runner import SimConfig, simulate\n"
        "simulate(SimConfig.model_validate({'workload': {'num_requests': 3}, "
        "'instance': {'cost_model': 'constant:0.01'}}))\n"
        "assert 'ortools' not in sys.modules, 'ortools imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_section45_finding() -> None:
    """Llama-2-7B/A100, O = B = 4, M = max(2I, I+O-1): for short inputs the optimum evicts
    and beats the best eviction-free schedule (proven globally optimal); for long ones the best
    schedule found does not evict (the solver's bound is too weak to prove it there)."""
    from sloserve.experiments.infermax.csp import csp_eviction_sweep

    # one worker and a deterministic limit: the same answer under any machine load
    df = csp_eviction_sweep(
        [4, 512], time_limit_s=60.0, deterministic_limit=0.5, workers=1, forced_eviction=True
    ).set_index("I")
    short, long = df.loc[4], df.loc[512]
    assert short["status"] == "optimal" and short["batches_sufficient"]  # a global optimum
    assert short["optimal_evictions"] > 0
    assert short["optimal_latency"] < short["best_ef_latency"]
    assert short["latency_gap_pct"] > 5
    assert long["optimal_evictions"] == 0
    # and the best schedule that does evict is slower than the eviction-free one
    assert long["best_evicting_status"] in ("optimal", "feasible")
    assert long["best_evicting_latency"] > long["best_ef_latency"]
    assert long["eviction_cost_pct"] > 0
    assert short["best_evicting_latency"] == short["optimal_latency"]
    assert "!r" in short["optimal_schedule"] and "!r" not in long["optimal_schedule"]
    assert long["optimal_latency"] <= long["best_preset_latency"] * (1 + 1e-9)


def test_replay_refuses_batches_the_engine_never_runs() -> None:
    jobs, limits = TINY["two-evict"]
    full = [
        ScheduledBatch(((0, 3),)),
        ScheduledBatch(((0, 1),)),
        ScheduledBatch(((1, 3),)),
        ScheduledBatch(((1, 1),)),
    ]
    replay(Schedule(tuple(full)), jobs, CM, limits)  # the valid schedule replays
    # a trailing batch for a finished request: evaluate refuses it, so must replay
    extra = Schedule((*full, ScheduledBatch(((1, 1),))))
    with pytest.raises(SchedulerViolation):
        evaluate(extra, jobs, CM, limits)
    with pytest.raises(SchedulerViolation, match="finished"):
        replay(extra, jobs, CM, limits)
    # a request id that is not in the instance is a violation, not a stall
    with pytest.raises(SchedulerViolation, match="not in the instance"):
        replay(Schedule((ScheduledBatch(((0, 3), (7, 1))),)), jobs, CM, limits)


def test_huge_or_non_finite_inputs_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Job(0, 2, 2, float("inf"))
    jobs = uniform_jobs(2, 2, 2)
    fast = CspOptions(**FAST)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="finite"):
        solve(jobs, Limits(4096, 4096, 100, 8, 1), ConstantCostModel(float("inf")), fast)
    with pytest.raises(ConfigError, match="too large"):
        solve(uniform_jobs(2, 10**8, 2), Limits(4096, 4096, 10**9, 8, 1), CM, fast)
    with pytest.raises(ConfigError, match="too large"):
        solve(uniform_jobs(3, 1, 10**5), Limits(4096, 4096, 10**6, 8, 1), CM, fast)
    with pytest.raises(ConfigError, match="too large"):
        solve(jobs, Limits(4096, 4096, 100, 8, 1), CM, dataclasses.replace(fast, max_batches=10**6))
    # a huge M on a tiny instance is fine (it never binds): no free list of 10^12 blocks
    huge = Limits(4096, 4096, 10**12, 8, 1)
    res = solve(jobs, huge, CM, CspOptions(workers=1, time_limit_s=20))
    assert res.schedule is not None and res.status == "optimal"
    assert replay(res.schedule, jobs, CM, huge).all_finished
    # a binary schedule file
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="not a text file"):
        read_schedule(path)


def test_infeasible_better_than_says_whether_it_is_global() -> None:
    jobs, limits = TINY["two-evict"]
    no = solve(jobs, limits, CM, CspOptions(better_than="vllm-ef", better_by_pct=50, **FAST))  # type: ignore[arg-type]
    assert no.status == "infeasible"
    # J = serving one request after another is far more than a schedule 50% better than
    # vllm-ef can use: the infeasibility is a proof over all schedules
    assert no.batches_sufficient is True


def test_hint_with_identical_requests_in_any_order_is_kept() -> None:
    jobs, limits = TINY["two-evict"]
    # request 1 first: breaks the finish-order symmetry breaking unless relabelled
    hint = Schedule(
        (
            ScheduledBatch(((1, 3),)),
            ScheduledBatch(((1, 1),)),
            ScheduledBatch(((0, 3),)),
            ScheduledBatch(((0, 1),)),
        )
    )
    res = solve(jobs, limits, CM, CspOptions(**FAST), hint=hint)  # type: ignore[arg-type]
    assert res.stats["hinted"] is True and res.status == "optimal"


def test_never_worse_than_the_warm_start_when_rounding_misranks() -> None:
    # a coarse time unit rounds the cost model badly: the integer optimum, priced exactly,
    # is worse than vllm's schedule; the warm start is then returned and flagged
    jobs, limits = uniform_jobs(3, 300, 2), Limits(4096, 4096, 600, 8, 1)
    res = solve(jobs, limits, CM, CspOptions(workers=1, time_limit_s=20, time_unit_s=3e-3))
    assert res.evaluation is not None and res.stats["kept_warm_start"] is True
    for b in res.baselines.values():
        if b.evaluation is not None:
            assert res.evaluation.total_latency <= b.evaluation.total_latency * (1 + 1e-12)
