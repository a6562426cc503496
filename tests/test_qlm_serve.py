"""QLM live: the ``x-slo-e2e-ms`` header sets a request's end-to-end deadline at the
gateway, and the emulated backend (QLM router) admits, serves and scores by it."""

# ruff: noqa: F811 - the fixtures imported from serve_helpers are test parameters

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_helpers import (  # noqa: F401  (server: fixture)
    MODEL,
    LiveServer,
    RecordingBackend,
    emulated,
    live_server,
    server,
)
from sloserve.serve.api import GatewaySettings

HDR = "x-slo-e2e-ms"


def test_the_header_sets_the_deadline_and_the_body_wins(server: LiveServer) -> None:
    be = server.backend
    assert isinstance(be, RecordingBackend)
    url = f"{server.base_url}/completions"
    base = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    assert httpx.post(url, json=base, headers={HDR: "2500"}, timeout=10).status_code == 200
    assert be.last is not None and be.last.slo.deadline_s == 2.5
    assert be.last.deadline == pytest.approx(be.last.arrival + 2.5)
    # the body's slo.deadline_ms wins over the header; its other fields leave it alone
    httpx.post(url, json={**base, "slo": {"deadline_ms": 900}}, headers={HDR: "2500"}, timeout=10)
    assert be.last.slo.deadline_s == 0.9
    httpx.post(url, json={**base, "slo": {"ttft_ms": 100}}, headers={HDR: "2500"}, timeout=10)
    assert (be.last.slo.ttft_s, be.last.slo.deadline_s) == (0.1, 2.5)


@pytest.mark.parametrize(
    "values",
    [["0"], ["-5"], ["86400001"], ["inf"], ["1_000"], ["soon"], ["100", "200"]],
)
def test_a_bad_or_contradicting_header_is_a_400_naming_it(
    server: LiveServer, values: list[str]
) -> None:
    headers = [(HDR, v) for v in values]
    r = httpx.post(
        f"{server.base_url}/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 1},
        headers=headers,
        timeout=10,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == HDR and HDR in err["message"]


def test_a_repeated_header_with_one_value_is_accepted(server: LiveServer) -> None:
    r = httpx.post(
        f"{server.base_url}/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 1},
        headers=[(HDR, "86400000"), (HDR, "86400000")],
        timeout=10,
    )
    assert r.status_code == 200, r.text


def _deadline_misses(text: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "sloserve_slo_violations_total" and s.labels["kind"] == "deadline":
                return s.value
    return 0.0


def test_the_emulated_qlm_gateway_admits_serves_and_scores_by_the_header() -> None:
    # no preset defaults: the header's deadline is the request's only SLO target
    settings = GatewaySettings(slo_preset="none")
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 40, "min_tokens": 40}
    be = emulated(replicas=2, router="qlm", admission="slo")
    with live_server(be, settings) as srv, httpx.Client(timeout=30) as c:
        url = srv.base_url + "/completions"
        ok = c.post(url, json=body, headers={HDR: "60000"})
        assert ok.status_code == 200, ok.text
        assert _deadline_misses(c.get(srv.url + "/metrics").text) == 0
        # 40 decode steps cannot end within 0.5 ms: refused at admission by the deadline
        late = c.post(url, json=body, headers={HDR: "0.5"})
        assert late.status_code == 429, late.text
        assert late.headers["x-sloserve-drop-reason"] == "deadline"
    # without admission the same request is served and counted as a missed deadline
    be = emulated(replicas=2, router="qlm")
    with live_server(be, settings) as srv, httpx.Client(timeout=30) as c:
        served = c.post(srv.base_url + "/completions", json=body, headers={HDR: "0.5"})
        assert served.status_code == 200, served.text
        assert _deadline_misses(c.get(srv.url + "/metrics").text) == 1
