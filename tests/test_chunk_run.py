"""A fast run through a prompt's final chunk (``engine/chunk_run.py``) changes nothing but
the number of policy decisions: every request's tokens, the iteration log, the trace rows,
the busy time, KV usage and ``busy_until`` seen mid-run are those of the engine without
it, with arrivals cutting runs (a cluster's fast path), aborts and a horizon; and the
requests' token times are those of stepping one iteration at a time."""

from __future__ import annotations

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
from sloserve.costmodel.base import ConstantCostModel
from sloserve.engine import chunk_run
from sloserve.engine.instance import Instance


def _simulate(
    setup: dict[str, Any],
    spec: list[tuple[float, int, int]],
    *,
    final: bool = True,
    join: bool = True,
    multi_step: bool = True,
    probes: list[float] = (),  # type: ignore[assignment]
    aborts: list[tuple[float, int]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """One run; ``final`` False turns the chunk runs off (the engine before), ``join``
    False only those from a joining chunk."""
    params = {
        "groups": setup["groups"],
        "hybrid": setup["hybrid"],
        "watermark": setup["watermark"],
        "preemption_mode": setup["mode"],
    }
    cost = small_linear_cost() if setup["cost"] == "linear" else ConstantCostModel(0.01)
    inst = make_drawn_instance("sarathi", setup, cost, params, multi_step=multi_step)
    if not final:
        inst.scheduler.repeats_final_chunk = False
    if not join:
        inst.scheduler.repeats_joined_chunk = False
    decisions = count_schedule_calls(inst.scheduler)
    reqs = [req(i, a, p, o) for i, (a, p, o) in enumerate(sorted(spec))]
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
    return {
        **outcome(inst, reqs),
        "times": [times(inst, r) for r in reqs],
        "kv": inst.kv.num_used_blocks,
        "probes": seen,
        "decisions": decisions[0],
    }


workloads = st.lists(
    st.tuples(st.floats(0, 0.8), st.integers(1, 200), st.integers(1, 30)), min_size=1, max_size=12
)
setups = st.fixed_dictionaries(
    {
        "groups": st.sampled_from(["decode-first", "prefill-first"]),
        "hybrid": st.booleans(),
        "watermark": st.sampled_from([0.0, 0.01, 0.1]),
        "mode": st.sampled_from(["recompute", "swap"]),
        "cost": st.sampled_from(["constant", "linear"]),
        "M": st.integers(60, 600),
        "C": st.integers(24, 256),
        "P": st.integers(4, 48),
        "R_max": st.integers(1, 8),
        "block_size": st.sampled_from([1, 4, 16]),
        "cut": st.booleans(),
        "horizon": st.none() | st.floats(0.05, 1.5),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=workloads,
    setup=setups,
    probes=st.lists(st.floats(0, 1.5), max_size=12),
    aborts=st.lists(st.tuples(st.floats(0, 1.0), st.integers(0, 11)), max_size=2),
)
def test_final_chunk_runs_change_only_the_decisions(
    spec: list[tuple[float, int, int]],
    setup: dict[str, Any],
    probes: list[float],
    aborts: list[tuple[float, int]],
) -> None:
    on = _simulate(setup, spec, probes=probes, aborts=aborts)
    off = _simulate(setup, spec, final=False, probes=probes, aborts=aborts)
    middle = _simulate(setup, spec, join=False, probes=probes, aborts=aborts)
    assert on["decisions"] <= middle["decisions"] <= off["decisions"]
    on.pop("decisions"), off.pop("decisions"), middle.pop("decisions")
    for a, b in zip(middle.pop("times"), off["times"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert middle == {k: v for k, v in off.items() if k != "times"}
    for a, b in zip(on.pop("times"), off.pop("times"), strict=True):
        np.testing.assert_array_equal(a, b)
    assert on == off  # trace rows, iteration ends and busy time: the same floats
    if not aborts and setup["horizon"] is None:
        # and the requests' token times are those of one iteration at a time
        single = _simulate(setup, spec, multi_step=False)
        assert [r[:3] for r in single["requests"]] == [r[:3] for r in on["requests"]]


_LONG = {
    "groups": "decode-first",
    "hybrid": True,
    "watermark": 0.0,
    "mode": "recompute",
    "cost": "linear",
    "M": 10_000,
    "C": 256,
    "P": 16,
    "R_max": 8,
    "block_size": 4,
    "cut": False,
    "horizon": None,
}


def test_a_chunked_prompt_is_one_decision_from_its_joining_chunk() -> None:
    # Two decoding requests, then a 70-token prompt in 16-token chunks: it joins, takes 3
    # middle chunks and a 6-token final chunk, three decisions before (join, the middle
    # run, the final chunk), two with the middle run going on through the final chunk,
    # one with the chain from the joining chunk.
    spec = [(0.0, 4, 40), (0.0, 4, 40), (0.05, 70, 5)]
    on = _simulate(_LONG, spec)
    middle = _simulate(_LONG, spec, join=False)
    off = _simulate(_LONG, spec, final=False)
    assert (off["decisions"] - middle["decisions"], off["decisions"] - on["decisions"]) == (1, 2)
    assert on["trace"] == off["trace"] == middle["trace"]
    assert on["iter_end"] == off["iter_end"] and on["busy"] == off["busy"]
    tr = off["trace"]
    rows = list(zip(tr["time"], tr["batch_tokens"], tr["steps"], strict=True))
    joined = next(i for i, (_t, tok, _s) in enumerate(rows) if tok == 2 + 16)
    # join (16 tokens), the middle run of 3 iterations, the final chunk (6 tokens + 2 decodes)
    assert [(tok, s) for _t, tok, s in rows[joined : joined + 3]] == [(18, 1), (18, 3), (8, 1)]
    r = on["requests"][2]
    assert r[2] == on["iter_end"][r[1][0]]  # first token at the final chunk's iteration end


@pytest.mark.parametrize(("prompt", "saved"), [(40, 2), (30, 1), (16, 0)])
def test_short_chunked_prompts(prompt: int, saved: int) -> None:
    # 40 tokens: join, one middle chunk, final (three steps became one); 30: join and
    # final (two became one); 16: one chunk, nothing to chain.
    spec = [(0.0, 4, 40), (0.05, prompt, 5)]
    on = _simulate(_LONG, spec)
    off = _simulate(_LONG, spec, final=False)
    assert off["decisions"] - on["decisions"] == saved
    assert on["trace"] == off["trace"] and on["busy"] == off["busy"]
    assert on["requests"] == off["requests"] and on["iter_end"] == off["iter_end"]


@pytest.mark.parametrize("where", [-0.2, 0.0, 0.3, 0.99, 1.0, 1.2, 1.5])
def test_an_arrival_mid_run_cuts_it_as_before(where: float) -> None:
    # ``where``: in units of the middle run's duration from its start (1.0: exactly at
    # its end, when the final chunk's decision was taken; beyond: during the final chunk;
    # below 0: during the joining chunk)
    spec = [(0.0, 4, 40), (0.0, 4, 40), (0.05, 70, 5)]
    setup = {**_LONG, "cut": True}
    tr = _simulate(setup, spec, final=False)["trace"]
    row = tr["steps"].index(3)
    at = tr["time"][row] + where * tr["duration"][row]
    spec.append((at, 30, 3))
    probes = [at - 0.001, at, at + 0.001, at + 0.02]
    on = _simulate(setup, spec, probes=probes)
    off = _simulate(setup, spec, final=False, probes=probes)
    assert on["decisions"] <= off["decisions"]
    on.pop("decisions"), off.pop("decisions")
    on.pop("times"), off.pop("times")
    assert on == off


@pytest.mark.parametrize("where", [-0.2, 0.3, 1.2])
def test_an_abort_mid_run_cuts_it_as_before(where: float) -> None:
    # The chunked prompt is aborted during its joining chunk, its middle run or its final
    # chunk: what was planned after it is given up exactly as the single steps gave it up
    # (teardown.abort drops the chain; the property test rarely lands an abort there).
    spec = [(0.0, 4, 40), (0.0, 4, 40), (0.05, 70, 5)]
    setup = {**_LONG, "cut": True}
    tr = _simulate(setup, spec, final=False)["trace"]
    row = tr["steps"].index(3)
    at = tr["time"][row] + where * tr["duration"][row]
    on = _simulate(setup, spec, aborts=[(at, 2)])
    off = _simulate(setup, spec, final=False, aborts=[(at, 2)])
    on.pop("decisions"), off.pop("decisions")
    on.pop("times"), off.pop("times")
    assert on == off


def test_pricing_the_final_chunk_as_a_middle_one_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The equality above has teeth: a final chunk priced with the middle chunk's
    # statistics (one plausible bug) moves the iteration ends.
    spec = [(0.0, 4, 40), (0.0, 4, 40), (0.05, 70, 5)]
    off = _simulate(_LONG, spec, final=False)

    def middle_priced(
        inst: Instance, start: float, rest: int, done: int, stats: Any, before: int
    ) -> float:
        return start + inst.cost_model.batch_time(stats)  # the middle chunk's statistics

    monkeypatch.setattr(chunk_run, "_final_end", middle_priced)
    bad = _simulate(_LONG, spec)
    assert bad["iter_end"] != off["iter_end"]


def test_not_taken_with_requests_waiting() -> None:
    # R_max = 2: the third request waits, so the final chunk could admit it: not run ahead.
    inst: Instance = make_instance("sarathi", C=256, P=16, R_max=2, M=10_000, block_size=4)
    assert inst.scheduler.repeats_final_chunk
    inst.waiting.append(req(9, 0.0, 4, 4))
    assert not chunk_run.eligible(inst)
    assert not make_instance("sarathi", params={"order": "input"}).scheduler.repeats_final_chunk
    assert not make_instance("sarathi-ef").scheduler.repeats_final_chunk
    assert not make_instance("vllm").scheduler.repeats_final_chunk


@pytest.mark.parametrize(
    "cluster",
    [
        {"replicas": [{"count": 3}], "router": "least-outstanding"},  # arrivals cut runs
        {"replicas": [{"count": 3}], "router": "least-loaded"},  # reads KV mid-run
        {"replicas": [{"count": 2}], "router": "jsq-tokens"},  # every event stops runs
        {
            "replicas": [{"count": 3}],
            "router": "least-outstanding",
            "router_params": {"max_outstanding": 5},
            "failures": [{"replica": 1, "at_s": 4.0, "recover_s": 7.0}],
        },
    ],
)
@pytest.mark.parametrize("kv_tokens", [None, 3000])
def test_cluster_runs_are_the_same_with_final_chunk_runs(
    cluster: dict[str, Any], kv_tokens: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd

    from sloserve.cluster import ClusterConfig
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import InstanceConfig, SimConfig
    from sloserve.workloads import PoissonArrivals, WorkloadSpec

    w = WorkloadSpec(mix="sharegpt", arrival=PoissonArrivals(rate=12.0), duration_s=12, seed=7)
    icfg = InstanceConfig(max_running=24, chunk_size=64, kv_capacity_tokens=kv_tokens)
    cfg = SimConfig(workload=w, instance=icfg, policy="sarathi", horizon_s=14.0)
    cc = ClusterConfig.load(cluster)
    starts = [0]
    real = chunk_run.start_final

    def counted(inst: Instance, pending: Any) -> None:
        starts[0] += 1
        real(inst, pending)

    monkeypatch.setattr(chunk_run, "start_final", counted)
    on = simulate_cluster(cfg, cc)
    # The final-chunk runs were taken (with a router that reads progress, only when no
    # event of any replica falls before the final chunk's end: rare at this rate).
    assert starts[0] > 0 or cc.router == "jsq-tokens"
    monkeypatch.setattr(chunk_run, "eligible", lambda inst: False)
    off = simulate_cluster(cfg, cc)
    pd.testing.assert_frame_equal(on.table, off.table)
    pd.testing.assert_frame_equal(on.trace, off.trace)
    for i, ends in off.iter_ends.items():
        np.testing.assert_array_equal(on.iter_ends[i], ends)
    drop = {"wall_seconds"}
    assert {k: v for k, v in on.summary.items() if k not in drop} == {
        k: v for k, v in off.summary.items() if k not in drop
    }
