"""A heterogeneous cluster — two models, two GPU kinds — where the router matters: the
SLO-aware router, which predicts each replica's TTFT from its own cost model, beats
round-robin, which splits a model's requests evenly between a fast H100 and slower A40s."""

from __future__ import annotations

from typing import Any

import sloserve


def _run(router: str) -> dict[str, Any]:
    cfg = {
        "workload": {
            "arrival": {"kind": "poisson", "rate": 30},
            "duration_s": 40,
            "seed": 3,
            "models": {"llama-2-7b": 0.7, "llama-3-8b": 0.3},
        },
        "cluster": {
            "replicas": [
                {"profile": "llama-2-7b-a40", "count": 2, "policy": "sarathi"},
                {"profile": "llama-2-7b-h100", "count": 1, "policy": "sarathi"},
                {"profile": "llama-3-8b-a100", "count": 2, "policy": "sarathi"},
            ],
            "router": router,
        },
    }
    return sloserve.simulate(cfg).summary


def test_slo_aware_beats_round_robin_on_ttft_attainment_under_load() -> None:
    rr, slo = _run("round-robin"), _run("slo-aware")
    assert rr["finished"] == slo["finished"] == rr["requests"]
    # Measured (seed 3): round-robin 0.96-0.97 TTFT attainment, p99 TTFT ~4 s (the A40s
    # queue up); slo-aware 1.00 and ~0.08 s. The margins asserted are about half of that.
    assert slo["ttft_attainment"] >= rr["ttft_attainment"] + 0.015
    assert slo["ttft_p99"] <= 0.25 * rr["ttft_p99"]
    by_model = slo["slo_attainment_by_model"]
    assert set(by_model) == {"llama-2-7b", "llama-3-8b"}
    served = {r["profile"]: 0 for r in slo["replicas"]}
    for r in slo["replicas"]:
        served[r["profile"]] += r["served"]
    # The fast H100 replica takes more of the Llama-2-7B traffic than each A40 does.
    per_a40 = served["llama-2-7b-a40"] / 2
    assert served["llama-2-7b-h100"] > per_a40
