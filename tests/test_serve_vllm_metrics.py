"""The emulated replicas' vLLM metrics: vLLM's names, types and labels, read back with the
parser the openai backend applies to real engines."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_helpers import MODEL, live_server
from sloserve.serve.scrape import parse_engine_load

# Written down from vLLM's documentation ("Production Metrics") and vllm/v1/metrics/
# loggers.py, not from our output: name as the exposition shows it -> Prometheus type.
VLLM_METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


def test_emulated_replicas_export_vllm_metrics() -> None:
    with live_server(replicas=2) as server:
        n, out = 6, 8
        with httpx.Client(timeout=30) as c:
            for i in range(n):
                r = c.post(
                    f"{server.base_url}/completions",
                    json={"model": MODEL, "prompt": "hello " * (10 + i), "max_tokens": out,
                          "min_tokens": out},
                )  # fmt: skip
                assert r.status_code == 200, r.text
            text = c.get(f"{server.url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in VLLM_METRICS.items():
        assert name in families, name
        fam = families[name]
        assert fam.type == kind, (name, fam.type)
        engines = {s.labels["engine"] for s in fam.samples}
        assert engines == {"0", "1"}, (name, engines)
        assert {s.labels["model_name"] for s in fam.samples} == {MODEL}
        assert {s.labels["replica"] for s in fam.samples} == {"replica-0", "replica-1"}
    assert "vllm:num_preemptions_total" in text  # the counter's exposition name

    def total(name: str, suffix: str) -> float:
        return sum(s.value for s in families[name].samples if s.name == name + suffix)

    # every request finished: one TTFT and one e2e each, out-1 token gaps each
    assert total("vllm:time_to_first_token_seconds", "_count") == n
    assert total("vllm:e2e_request_latency_seconds", "_count") == n
    assert total("vllm:inter_token_latency_seconds", "_count") == n * (out - 1)
    assert total("vllm:time_per_output_token_seconds", "_sum") == pytest.approx(
        total("vllm:inter_token_latency_seconds", "_sum")
    )
    assert total("vllm:generation_tokens", "_total") == n * out
    assert total("vllm:prompt_tokens", "_total") > 0
    e2e = total("vllm:e2e_request_latency_seconds", "_sum")
    assert 0 < total("vllm:time_to_first_token_seconds", "_sum") < e2e
    # the scraper the openai backend uses on vLLM engines reads the same load
    load = parse_engine_load(text)
    assert load.waiting == 0 and load.running == 0
    assert load.kv_usage == pytest.approx(0.0)
    assert 'sloserve_replica_kv_usage_ratio{replica="replica-1"}' in text


def test_vllm_metrics_count_each_request_once_and_read_load() -> None:
    with live_server() as server, httpx.Client(timeout=30) as c:
        r = c.post(f"{server.base_url}/completions",
                   json={"model": MODEL, "prompt": "hi", "max_tokens": 4})  # fmt: skip
        assert r.status_code == 200
        first = c.get(f"{server.url}/metrics").text
        second = c.get(f"{server.url}/metrics").text
    line = (
        'vllm:e2e_request_latency_seconds_count{engine="0",model_name="%s",replica="replica-0"} 1.0'
    )
    assert line % MODEL in first and line % MODEL in second


def test_scraper_reads_the_ratio_gauge_of_a_sloserve_upstream() -> None:
    text = (
        'sloserve_replica_kv_usage_ratio{replica="replica-0"} 0.2\n'
        'sloserve_replica_kv_usage_ratio{replica="replica-1"} 0.6\n'
    )
    assert parse_engine_load(text).kv_usage == pytest.approx(0.4)
