"""QLM's §8 baselines with naive model swapping (``fcfs-swap``, ``edf-swap``): per-replica
queues, head-of-line pull, a model change whenever the head's model differs."""

from __future__ import annotations

from typing import Any

import pytest

import sloserve

MULTI: dict[str, Any] = {
    "replicas": [{"count": 1, "profile": "llama-2-7b-a100"}, {"count": 1, "profile": "phi-2-a100"}],
    "models": {"llama-3-8b": {"profile": "llama-3-8b-a100"}},
}
WORKLOAD: dict[str, Any] = {
    "arrival": {"kind": "poisson", "rate": 4},
    "duration_s": 6,
    "slo": "qlm",
    "classes": {"rt": 0.5, "be": 0.5},
    "seed": 3,
}
MODELS = {"llama-2-7b": 0.4, "phi-2": 0.3, "llama-3-8b": 0.3}


def _run(router: str, cluster: dict[str, Any], **wl: Any) -> dict[str, Any]:
    s: dict[str, Any] = sloserve.simulate(
        # a horizon: a replica that never changes to a held request's model ends the run
        {"workload": {**WORKLOAD, **wl}, "horizon_s": 300},
        policy="vllm",
        cluster={**cluster, "router": router},
    ).summary
    return s


@pytest.mark.parametrize("router", ["fcfs-swap", "edf-swap"])
def test_naive_swapping_thrashes_under_multi_model_load(router: str) -> None:
    naive, smart = _run(router, MULTI, models=MODELS), _run("edf", MULTI, models=MODELS)
    # every request is served, its model loaded on demand (cold: nothing kept warm)
    assert naive["finished"] == naive["requests"] > 15
    assert naive["qlm"]["mode"] == router
    assert set(naive["model_loads_by_tier"]) == {"disk"}
    # the head alternates between models: far more changes than the idle-only baseline
    assert naive["qlm"]["model_changes"] >= 3 * max(smart["qlm"]["model_changes"], 1)
    assert naive["throughput_tokens_per_s"] < smart["throughput_tokens_per_s"]


def test_a_single_model_run_never_swaps() -> None:
    s = _run("fcfs-swap", {"replicas": [{"count": 2}]})
    assert s["finished"] == s["requests"] > 15
    assert s["qlm"]["model_changes"] == 0 and not s["model_loads_by_tier"]
