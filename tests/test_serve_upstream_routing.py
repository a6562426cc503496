"""Routing between upstreams, without HTTP: the SLO-aware router's per-request TTFT
prediction from the cost model, and requests sent only to the upstreams that serve
their model (404 for a model none serves, 503 when those that do are down)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from serve_helpers import greq, offline_backend
from sloserve.serve.backend import ServeError


def test_slo_aware_routing_uses_the_cost_model_per_request() -> None:
    b = offline_backend(
        upstreams=("http://127.0.0.1:9", "http://127.0.0.1:10"),
        router="slo-aware",
        profile="llama-2-7b-a100",
        max_concurrency=8,
    )
    b._ups[0].queued_prompt_tokens = 8000  # a long prefill queued there
    b._ups[1].in_flight = 6  # busy decoding, but no prefill ahead
    assert b._pick(greq(prompt=500)) == 1
    states = b.replicas()
    assert states[0].predicted_ttft_s is not None and states[1].predicted_ttft_s is not None
    assert states[0].predicted_ttft_s > states[1].predicted_ttft_s
    b._ups[1].in_flight = 8  # full: the only one with a slot wins whatever its TTFT
    assert b._pick(greq(prompt=500)) == 0


def test_requests_go_to_upstreams_serving_their_model() -> None:
    b = offline_backend(upstreams=("http://127.0.0.1:9", "http://127.0.0.1:10"), max_concurrency=4)
    b._ups[0].models, b._ups[1].models = ("llama",), ("mistral",)
    r = greq()
    r.model = "mistral"
    assert {b._pick(r) for _ in range(4)} == {1}
    r.model = "llama"
    assert {b._pick(r) for _ in range(4)} == {0}
    b._ups[1].models = ()  # has not said: may serve anything
    assert {b._pick(r) for _ in range(6)} == {0, 1}
    assert sorted(b.models()) == ["llama"]
    b._ups[1].models = ("mistral",)
    r.model = "gpt-4"
    with pytest.raises(ServeError) as e:
        b._admit(r)
    assert (e.value.status, e.value.reason) == (404, "model")
    r.model = "llama"
    b._ups[0].health_ok = False  # the one serving llama is down: 503, though 1 is healthy
    with pytest.raises(ServeError) as e:
        b._admit(r)
    assert (e.value.status, e.value.reason) == (503, "no_backend")
