"""The SHEPHERD-like ``static-batch`` baseline: the batch plan (hand cases) and a run."""

from __future__ import annotations

from typing import Any

import pytest

import sloserve
from sloserve.cluster.qlm.rct import HardwareProfile
from sloserve.cluster.qlm.static import batch_duration, plan_batch


def test_the_batch_plan_maximises_deadlines_met_then_size() -> None:
    # d(k) = k seconds: requests due at 1, 2, 3, 3.5 and 10 s
    dl: list[tuple[float, int | str]] = [
        (3.5, "d"),
        (1.0, "a"),
        (10.0, "e"),
        (2.0, "b"),
        (3.0, "c"),
    ]
    # k=3 meets a? no (1 < 3): b? no; c, d, e meet -> 3 met; k=4 meets d? no (3.5 < 4): e -> 1
    assert plan_batch(dl, 0.0, 8, float) == ["c", "d", "e"]
    # the cap bounds the batch; with two slots the two that can still make it go
    assert plan_batch(dl, 0.0, 2, float) == ["b", "c"]
    # all late: still a full batch (throughput), earliest deadlines first
    assert plan_batch([(0.5, 1), (0.2, 2)], 0.0, 4, lambda k: 5.0) == [2, 1]
    assert plan_batch([], 0.0, 4, float) == []


def test_the_batch_lasts_as_long_as_its_expected_longest_output() -> None:
    hw = HardwareProfile(1e-4, 0.02, 1000.0, 1.5)
    assert batch_duration(1, 100, hw, 200, 50) == pytest.approx(100 * 1e-4 + 200 * 0.03)
    d8 = batch_duration(8, 100, hw, 200, 50)
    assert d8 == pytest.approx(8 * 100 * 1e-4 + (200 + 50 * (2 * 2.0794415) ** 0.5) * 0.03)
    assert d8 > batch_duration(2, 100, hw, 200, 50)


def test_a_static_batch_run_serves_everything_slower_than_qlm() -> None:
    wl: dict[str, Any] = {
        "arrival": {"kind": "poisson", "rate": 30},
        "duration_s": 8,
        "slo": "qlm",
        "classes": {"rt": 0.5, "be": 0.5},
    }

    def run(router: str, policy: str) -> dict[str, Any]:
        s: dict[str, Any] = sloserve.simulate(
            {"workload": wl, "horizon_s": 400},
            policy=policy,
            cluster={"replicas": [{"count": 2}], "router": router},
        ).summary
        return s

    static, qlm = run("static-batch", "vllm"), run("qlm", "qlm")
    assert static["finished"] == static["requests"] > 100
    assert static["qlm"]["mode"] == "static-batch" and static["qlm"]["static_batches"] > 2
    assert static["preemptions"] == 0
    # a batch waits for its longest output: less throughput than continuous batching
    assert static["throughput_tokens_per_s"] < qlm["throughput_tokens_per_s"]


def test_members_are_judged_at_their_own_end_and_decode_time_grows_with_the_batch() -> None:
    # a batch of 2 lasts 10 s (its longest), but each member ends by 4 s
    dl = [(5.0, "rt1"), (5.0, "rt2"), (300.0, "be")]
    assert plan_batch(dl, 0.0, 2, lambda k: 10.0) == ["be", "rt1"]  # judged at 10 s
    assert plan_batch(dl, 0.0, 2, lambda k: 10.0, lambda k: 4.0) == ["rt1", "rt2"]
    hw = HardwareProfile(1e-4, 0.04, 1000.0, 1.5, batch=11, decode_s_single=0.01)
    assert hw.decode_at(1) == pytest.approx(0.01)
    assert hw.decode_at(6) == pytest.approx(0.01 + 0.5 * (0.06 - 0.01))
    assert hw.decode_at(11) == hw.decode_at(50) == pytest.approx(0.06)
    assert HardwareProfile(1e-4, 0.04, 1000.0, 1.5).decode_at(1) == pytest.approx(0.06)
