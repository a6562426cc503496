"""Upstream health: the health checks against fake engines on 127.0.0.1 (an unhealthy
upstream gets nothing; none healthy is a 503), the models the upstreams serve, and the
load scraped from an engine's /metrics (vLLM, SGLang, sloserve; odd values survive)."""

# ruff: noqa: F811 - the fixtures imported from serve_helpers are test parameters

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from serve_helpers import (  # noqa: F401  (engines, fakes: fixtures)
    collect,
    engines,
    fakes,
    greq,
    run_backend,
)
from sloserve.serve.backend import ServeError
from sloserve.serve.scrape import parse_engine_load
from sloserve.serve.upstream import OpenAIUpstreamBackend
from sloserve.serve.upstream_config import UpstreamConfig


def test_health_scrape_models_and_no_backend(fakes: Any) -> None:
    (u1, f1), (u2, f2) = fakes
    f1.metrics = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="m"} 3\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} 5\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="m"} 0.42\n'
    )
    f2.healthy = False
    cfg = UpstreamConfig(upstreams=(u1, u2), health_interval_s=0.05)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        reps = b.replicas()
        picks = [await collect(b, greq()) for _ in range(3)]
        f1.healthy = False
        await asyncio.sleep(0.3)
        with pytest.raises(ServeError) as e:
            await collect(b, greq())
        f2.healthy = True
        await asyncio.sleep(0.3)
        ok = await collect(b, greq())
        return reps, picks, e.value, ok, list(b.models())

    reps, picks, err, ok, models = run_backend(cfg, go)
    assert all(p[-1].finish_reason == "length" for p in picks)
    assert (reps[0].waiting, reps[0].running, reps[0].kv_usage) == (3, 5, 0.42)
    assert reps[0].healthy and not reps[1].healthy
    assert len(f2.bodies) == 1 and len(f1.bodies) == 3  # unhealthy one got nothing until back
    assert (err.status, err.reason) == (503, "no_backend")
    assert ok[-1].finish_reason == "length"
    assert models == ["fake-model"]


def test_odd_metrics_do_not_kill_health_checks(fakes: Any) -> None:
    (u1, f1), _ = fakes
    f1.metrics = "vllm:num_requests_waiting 1e400\n"
    cfg = UpstreamConfig(upstreams=(u1,), health_interval_s=0.05)

    async def go(b: OpenAIUpstreamBackend) -> Any:
        f1.healthy = False
        await asyncio.sleep(0.3)
        assert b._health_task is not None and not b._health_task.done()
        return b.replicas()[0].healthy

    assert run_backend(cfg, go) is False


def test_scrape_vllm_sglang_sloserve_and_missing() -> None:
    old_vllm = (
        'vllm:num_requests_waiting{model_name="a"} 1\nvllm:num_requests_waiting{model_name="b"} 2\n'
        'vllm:num_requests_running{model_name="a"} 4\nvllm:gpu_cache_usage_perc{model_name="a"} 0.5\n'
    )
    assert parse_engine_load(old_vllm) == parse_engine_load(old_vllm)  # deterministic
    load = parse_engine_load(old_vllm)
    assert (load.waiting, load.running, load.kv_usage) == (3, 4, 0.5)
    sglang = "sglang:num_queue_reqs 7\nsglang:num_running_reqs 2\nsglang:token_usage 0.25\n"
    load = parse_engine_load(sglang)
    assert (load.waiting, load.running, load.kv_usage) == (7, 2, 0.25)
    ours = (
        'sloserve_replica_waiting{replica="replica-0"} 1\nsloserve_replica_waiting{replica="replica-1"} 2\n'
        'sloserve_replica_kv_usage{replica="replica-0"} 0.2\nsloserve_replica_kv_usage{replica="replica-1"} 0.4\n'
    )
    load = parse_engine_load(ours)
    assert load.waiting == 3 and load.running is None and load.kv_usage == pytest.approx(0.3)
    assert parse_engine_load("process_cpu_seconds_total 3\n").waiting is None
    with pytest.raises(ValueError):
        parse_engine_load("this is { not prometheus")


def test_scrape_survives_infinite_and_negative_values() -> None:
    load = parse_engine_load(
        "vllm:num_requests_waiting +Inf\nvllm:num_requests_running -3\n"
        "vllm:kv_cache_usage_perc +Inf\n"
    )
    assert load.waiting is None and load.running == 0 and load.kv_usage is None
