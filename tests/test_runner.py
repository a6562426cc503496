"""Whole runs through the Python API: determinism, the InferMax §4.2 trend, profiles."""

import pytest

from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.costmodel.profile import load_profile
from sloserve.experiments.runner import InstanceConfig, SimConfig, compare, simulate
from sloserve.policies.registry import make_policy
from sloserve.workloads import ConstantArrivals, FixedLength, GammaArrivals, WorkloadSpec


def test_same_seed_same_result_and_seed_matters() -> None:
    w = WorkloadSpec(arrival=GammaArrivals(rate=6, cv=3), duration_s=40, seed=3)
    cfg = SimConfig(workload=w, policy="sarathi")
    a, b = simulate(cfg), simulate(cfg)
    keys = [k for k in a.summary if k != "wall_seconds"]
    assert {k: a.summary[k] for k in keys} == {k: b.summary[k] for k in keys}
    assert a.table.drop(columns=[]).equals(b.table)
    c = simulate(cfg.model_copy(update={"workload": w.model_copy(update={"seed": 4})}))
    assert (
        c.summary["requests"] != a.summary["requests"]
        or c.summary["e2e_mean"] != a.summary["e2e_mean"]
    )


def test_infermax_4_2_trend_vllm_lower_ttft_higher_tpot_than_sarathi() -> None:
    # Offline, high contention (InferMax §4.2): 1024 requests at once, I=128, O=512,
    # Llama-2-7B/A100 with M=100K and R_max unlimited (1024).
    w = WorkloadSpec(
        arrival=ConstantArrivals(rate=1e6),
        num_requests=1024,
        duration_s=None,
        prompt=FixedLength(value=128),
        output=FixedLength(value=512),
    )
    cfg = SimConfig(
        workload=w, instance=InstanceConfig(max_running=1024, kv_capacity_tokens=100_000)
    )
    res = compare(cfg, ["vllm", "sarathi"])
    v, s = res["vllm"].summary, res["sarathi"].summary
    assert v["finished"] == s["finished"] == 1024
    assert v["ttft_mean"] < s["ttft_mean"]
    assert v["tpot_mean"] > s["tpot_mean"]


def test_compare_replays_identical_requests() -> None:
    cfg = SimConfig(workload=WorkloadSpec(duration_s=20, seed=1))
    res = compare(cfg, ["vllm", "vllm-ef", "edf"])
    arrivals = [tuple(r.table["arrival_s"]) for r in res.values()]
    assert arrivals[0] == arrivals[1] == arrivals[2]
    with pytest.raises(ConfigError):
        compare(cfg, ["vllm", "vllm"])


def test_registry_lists_valid_names_on_a_typo() -> None:
    with pytest.raises(UnknownNameError, match="sarathi"):
        make_policy("sarathy")
    with pytest.raises(ConfigError, match="unknown parameter"):
        make_policy("vllm", {"chunk": 3})
    with pytest.raises(UnknownNameError, match="llama-2-7b-a100"):
        load_profile("llama-9")


def test_kv_capacity_from_gpu_memory() -> None:
    p = load_profile("llama-2-7b-a100")
    # 0.9 × 80 GiB − 13.5 GB weights − 1 GiB activations, at 0.5 MiB of KV per token
    assert p.kv_bytes_per_token == 2 * 32 * 4096 * 2
    assert 110_000 < p.kv_capacity_tokens(0.9) < 125_000
    assert p.kv_capacity_tokens(0.5) < p.kv_capacity_tokens(0.9)
    with pytest.raises(ConfigError):
        p.kv_capacity_tokens(0.1)  # weights don't fit


def test_horizon_after_the_last_finish_changes_nothing() -> None:
    cfg = SimConfig(workload=WorkloadSpec(duration_s=20, seed=1))
    a = simulate(cfg).summary
    b = simulate(cfg.model_copy(update={"horizon_s": 1000.0})).summary
    for k in ("simulated_seconds", "throughput_tokens_per_s", "busy_fraction", "iterations", "finished"):
        assert a[k] == b[k], k
    c = simulate(cfg.model_copy(update={"horizon_s": 10.0})).summary
    assert c["simulated_seconds"] == 10.0 and c["aborted"] > 0
    assert c["busy_fraction"] <= 1.0


def test_chunk_size_is_p_only_for_chunked_policies() -> None:
    cfg = SimConfig(workload=WorkloadSpec(duration_s=20, seed=1), instance=InstanceConfig(chunk_size=256))
    res = compare(cfg, ["vllm", "sarathi"])
    assert res["vllm"].summary["rejected"] == 0  # whole prompts, P = C
    assert res["vllm"].summary["limits"]["max_prefill_tokens"] == 4096
    assert res["sarathi"].summary["limits"]["max_prefill_tokens"] == 256


def test_jsonable_is_strict_json() -> None:
    import json

    import numpy as np

    from sloserve.experiments.report import jsonable

    data = {1: [np.float64("nan"), float("inf"), -np.inf, np.int64(3), (2.5, "x")]}
    out = jsonable(data)
    assert out == {"1": [None, "inf", "-inf", 3, [2.5, "x"]]}
    json.loads(json.dumps(out), parse_constant=lambda c: pytest.fail(f"non-standard {c}"))
