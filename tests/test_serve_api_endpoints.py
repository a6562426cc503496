"""The gateway's endpoints besides the completions, on 127.0.0.1: /v1/models, /health,
/openapi.json, an unknown path's 404, and the Prometheus /metrics (request, SLO, QoE
and replica series; the queue size counts the gateway's own queue too)."""

# ruff: noqa: F811 - the fixtures imported from serve_helpers are test parameters

from __future__ import annotations

from collections.abc import Sequence

import httpx
import openai

from serve_helpers import (  # noqa: F401  (client, server: fixtures)
    MODEL,
    FlakyBackend,
    LiveServer,
    client,
    server,
)
from sloserve.serve.backend import ReplicaState


def test_models_health_openapi(server: LiveServer, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    r = httpx.get(f"{server.url}/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    schema = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"} <= set(
        schema["paths"]
    )
    props = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"slo", "qoe", "priority", "request_class", "stream_options"} <= set(props)
    r = httpx.get(f"{server.url}/nowhere", timeout=10)
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_metrics(server: LiveServer) -> None:
    httpx.post(
        f"{server.base_url}/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 3, "slo": {"ttft_ms": 0.001}},
        timeout=10,
    )
    httpx.post(
        f"{server.base_url}/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 3, "request_class": "be",
              "qoe": {"ttft_s": 5.0, "tokens_per_s": 1.0}},
        timeout=10,
    )  # fmt: skip
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    # a reader expecting the first token within 5 s at 1 token/s is served perfectly
    assert 'sloserve_request_qoe_bucket{class="be",le="0.99"} 0.0' in text
    assert 'sloserve_request_qoe_bucket{class="be",le="1.0"} 1.0' in text
    for name in (
        "sloserve_request_ttft_seconds_bucket", "sloserve_request_tpot_seconds_count",
        "sloserve_request_duration_seconds_sum", "sloserve_queue_size",
        'sloserve_requests_total{class="rt",status="ok"}',
        'sloserve_requests_total{class="rt",status="rejected"}',
        'sloserve_slo_violations_total{class="rt",kind="ttft"}',
        'sloserve_replica_running{replica="replica-0"}',
        'sloserve_replica_waiting{replica="replica-0"}',
        'sloserve_replica_kv_usage_ratio{replica="replica-0"}',
    ):  # fmt: skip
        assert name in text, name
    ok = next(
        line for line in text.splitlines()
        if line.startswith('sloserve_requests_total{class="rt",status="ok"}')
    )  # fmt: skip
    assert float(ok.split()[-1]) >= 1
    viol = next(
        line for line in text.splitlines()
        if line.startswith('sloserve_slo_violations_total{class="rt",kind="ttft"}')
    )  # fmt: skip
    assert float(viol.split()[-1]) >= 1  # a 1 µs TTFT target is always missed


class QueuedBackend(FlakyBackend):
    """Two replicas with waiting requests and a gateway queue of its own."""

    @property
    def queue_size(self) -> int:
        return 5

    def replicas(self) -> Sequence[ReplicaState]:
        return [ReplicaState("a", True, 1, 2, 0.5), ReplicaState("b", True, 1, 3, 0.5)]


def test_queue_size_metric_adds_the_gateway_queue() -> None:
    from sloserve.serve.metrics import GatewayMetrics

    text = GatewayMetrics(QueuedBackend()).render().decode()
    assert "\nsloserve_queue_size 10.0\n" in text  # 2 + 3 waiting at replicas + 5 queued
    text = GatewayMetrics(FlakyBackend()).render().decode()
    assert "\nsloserve_queue_size 0.0\n" in text
