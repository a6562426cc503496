"""Generated prompt identity (``workloads/sessions.py``): tenant system prompts, closed-loop
multi-turn sessions, their YAML validation, and session affinity on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cli_helpers import assert_user_error, run_main, write
from sloserve.cluster.config import ClusterConfig
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import SimConfig, simulate
from sloserve.workloads.sessions import BLOCK_TOKENS
from sloserve.workloads.spec import WorkloadSpec, build_workload


def spec(**kw: Any) -> WorkloadSpec:
    base: dict[str, Any] = {
        "mix": "sharegpt",
        "num_requests": 6,
        "duration_s": None,
        "arrival": {"kind": "poisson", "rate": 1.0},
    }
    return WorkloadSpec(**(base | kw))


def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_tenants_share_exactly_their_system_prompt_blocks() -> None:
    wl = build_workload(spec(num_requests=40, prefix={"system_prompt_tokens": 1500, "tenants": 3}))
    shared = 1500 // BLOCK_TOKENS  # 2 full blocks; the third mixes in the message
    reqs = wl.requests
    assert wl.sessions is None and all(r.session_id is None for r in reqs)
    seen_same = seen_other = False
    for i, a in enumerate(reqs):
        assert a.hash_ids is not None and a.num_prompt_tokens > 1500
        assert len(a.hash_ids) == -(-a.num_prompt_tokens // BLOCK_TOKENS)
        for b in reqs[i + 1 :]:
            assert b.hash_ids is not None
            n = common(a.hash_ids, b.hash_ids)
            if a.hash_ids[0] == b.hash_ids[0]:  # same tenant
                assert n == shared
                seen_same = True
            else:
                assert n == 0
                seen_other = True
    assert seen_same and seen_other


def test_a_later_turn_extends_the_previous_prompt_and_its_blocks() -> None:
    wl = build_workload(
        spec(
            num_requests=3,
            prefix={"system_prompt_tokens": 700, "tenants": 1},
            sessions={
                "turns": {"mean": 3, "dist": "fixed"},
                "think_time_s": 2.0,
                "think_time_dist": "fixed",
            },
            output={"kind": "fixed", "value": 300},
            prompt={"kind": "fixed", "value": 400},
        )
    )
    plan = wl.sessions
    assert plan is not None and plan.num_turns == 6
    first = wl.requests[0]
    assert first.num_prompt_tokens == 1100 and first.session_id == 0
    t2 = plan.after[first.req_id]
    assert t2.prompt_tokens == 1100 + 300 + 400 and t2.think_s == 2.0
    ids1 = plan.block_ids(0, 1100)
    ids2 = plan.block_ids(0, t2.prompt_tokens)
    assert ids1 == first.hash_ids and ids2[: len(ids1)] == ids1
    # Ids: first turns 0..2 by arrival, later turns after them by (session, turn).
    assert [t.req_id for t in plan.after.values()] == [3, 4, 5, 6, 7, 8]


def test_a_second_turn_hits_exactly_the_previous_prompts_full_blocks() -> None:
    wl = spec(
        num_requests=1,
        sessions={
            "turns": {"mean": 2, "dist": "fixed"},
            "think_time_s": 1.5,
            "think_time_dist": "fixed",
        },
        prompt={"kind": "fixed", "value": 1300},
        output={"kind": "fixed", "value": 50},
    )
    res = simulate(SimConfig(workload=wl, policy="vllm"))
    one, two = sorted(res.requests, key=lambda r: r.req_id)
    assert two.num_prompt_tokens == 1300 + 50 + 1300
    assert one.num_cached_tokens == 0
    assert two.num_cached_tokens == (1300 // BLOCK_TOKENS) * BLOCK_TOKENS  # 1,024
    # The closed loop: the second turn arrives the think time after the first finished.
    assert one.finish_time is not None
    assert two.arrival == pytest.approx(one.finish_time + 1.5)
    off = simulate(
        SimConfig(workload=wl, policy="vllm", instance={"prefix_caching": False})
    ).requests
    assert max(r.num_cached_tokens for r in off) == 0


def test_generation_and_runs_are_deterministic() -> None:
    s = spec(
        num_requests=20,
        prefix={"system_prompt_tokens": 1024, "tenants": 4},
        sessions={"turns": {"mean": 4}, "think_time_s": 3.0},
    )
    a, b = build_workload(s), build_workload(s)
    assert [(r.req_id, r.arrival, r.num_prompt_tokens, r.hash_ids) for r in a.requests] == [
        (r.req_id, r.arrival, r.num_prompt_tokens, r.hash_ids) for r in b.requests
    ]
    assert a.sessions is not None and b.sessions is not None
    assert a.sessions.after == b.sessions.after
    # Other components' draws do not move: the arrivals are the plain workload's.
    plain = build_workload(spec(num_requests=20))
    assert [r.arrival for r in a.requests] == [r.arrival for r in plain.requests]
    r1 = simulate(SimConfig(workload=s, policy="sarathi"))
    r2 = simulate(SimConfig(workload=s, policy="sarathi"))
    assert len(r1.requests) > 20
    assert r1.table.equals(r2.table)


def test_a_session_stops_at_the_context_window() -> None:
    wl = build_workload(
        spec(
            num_requests=1,
            max_context=4000,
            sessions={"turns": {"mean": 10, "dist": "fixed"}, "think_time_s": 1.0},
            prompt={"kind": "fixed", "value": 1000},
            output={"kind": "fixed", "value": 100},
        )
    )
    assert wl.sessions is not None
    # 1000+100, 2200+100, 3400+100: the fourth turn (4,600) would not fit.
    assert [t.prompt_tokens for t in wl.sessions.after.values()] == [2100, 3200]
    assert any("cut at the context window" in n for n in wl.notes)


def test_session_affinity_beats_round_robin_on_hit_rate() -> None:
    wl = spec(
        num_requests=None,
        duration_s=60.0,
        arrival={"kind": "poisson", "rate": 1.5},
        prefix={"system_prompt_tokens": 600, "tenants": 20},
        sessions={"turns": {"mean": 6}, "think_time_s": 5.0},
        seed=3,
    )
    cfg = SimConfig(workload=wl, policy="sarathi")
    rate = {
        router: simulate_cluster(
            cfg, ClusterConfig(replicas=[{"count": 4}], router=router)
        ).summary["prefix_hit_rate"]
        for router in ("round-robin", "session-affinity")
    }
    assert rate["session-affinity"] > rate["round-robin"] + 0.1, rate


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"prefix": {"system_prompt_tokens": 0, "tenants": 2}}, "system_prompt_tokens"),
        ({"prefix": {"system_prompt_tokens": 100, "tenants": 0}}, "tenants"),
        ({"sessions": {"turns": {"mean": 0.5}}}, "mean"),
        ({"sessions": {"turns": {"mean": 2.5, "dist": "fixed"}}}, "whole number"),
        ({"sessions": {"turns": {"mean": 2}, "think_time_s": -1}}, "think_time_s"),
        ({"sessions": {"turns": {"mean": 2}, "wait": 1}}, "wait"),
        (
            {"sessions": {"turns": {"mean": 2}}, "batch_jobs": {"num_batches": 1}},
            "both closed loops",
        ),
        ({"prefix": {"system_prompt_tokens": 10, "tenants": 1}, "trace": "x.jsonl"}, "trace"),
    ],
)
def test_bad_fields_are_validation_errors(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        spec(**fields)


def test_bad_yaml_is_a_one_line_error_on_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = write(
        tmp_path / "w.yaml",
        "workload: {num_requests: 3, sessions: {turns: {mean: 0}, think_time_s: 1}}\n",
    )
    res = run_main(monkeypatch, capsys, "simulate", "--config", str(bad))
    assert_user_error(res, "mean")
    good = write(
        tmp_path / "g.yaml",
        "workload: {num_requests: 3, duration_s: null, prefix: {system_prompt_tokens: 600,"
        " tenants: 2}, sessions: {turns: {mean: 2, dist: fixed}, think_time_s: 1}}\n",
    )
    res = run_main(monkeypatch, capsys, "simulate", "--config", str(good))
    assert res.returncode == 0, res.stderr
    assert "prefix hit" in res.stdout


def test_hit_rate_over_time_adds_up_to_the_runs_hit_rate() -> None:
    from sloserve.experiments.html_report import report_data

    wl = spec(
        num_requests=None,
        duration_s=40.0,
        arrival={"kind": "poisson", "rate": 1.0},
        prefix={"system_prompt_tokens": 1100, "tenants": 3},
        sessions={"turns": {"mean": 4}, "think_time_s": 2.0},
    )
    res = simulate_cluster(
        SimConfig(workload=wl, policy="sarathi"),
        ClusterConfig(replicas=[{"count": 3}], router="session-affinity"),
    )
    s = res.summary
    over = s["prefix_hits_over_time"]
    assert [rep["replica"] for rep in over["replicas"]] == [0, 1, 2]
    assert over["bin_s"] in (0.5, 1.0, 2.0) and over["t"][-1] <= s["simulated_seconds"]
    looked = sum(sum(rep["lookup_tokens"]) for rep in over["replicas"])
    found = sum(sum(rep["hit_tokens"]) for rep in over["replicas"])
    assert looked == s["prefix_lookup_tokens"] and found == s["prefill_tokens_saved"] > 0
    for rep in over["replicas"]:
        rows = zip(rep["lookup_tokens"], rep["hit_tokens"], rep["hit_rate"], strict=True)
        for lk, h, rate in rows:
            assert rate is None if lk == 0 else rate == min(1.0, max(0.0, h / lk))
    series = report_data({"run": res})["timeline"]["prefix_hit"]
    assert [x["name"] for x in series] == [f"run · replica {i}" for i in range(3)]
    assert all(0 <= y <= 100 for x in series for y in x["y"])
    off = simulate(SimConfig(workload=wl, policy="sarathi", instance={"prefix_caching": False}))
    assert "prefix_hits_over_time" not in off.summary
    assert report_data({"off": off})["timeline"]["prefix_hit"] == []
