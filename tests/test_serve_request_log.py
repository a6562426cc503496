"""The gateway's request log (one INFO line per request on ``sloserve.serve``) and its
token and SLO-attainment counters."""

from __future__ import annotations

import logging
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_helpers import MODEL, live_server
from sloserve.serve.server import log_config


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_request_log_and_counters(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sloserve.serve")
    url = "/completions"
    sent = [  # (headers, max_tokens, SLO met)
        ({"x-slo-ttft-ms": "0.001"}, 5, "false"),  # no engine answers within a microsecond
        ({"x-slo-ttft-ms": "60000", "x-slo-tpot-ms": "60000"}, 6, "true"),
        ({"x-request-class": "be"}, 7, "-"),  # bros gives best effort no target
    ]
    usage = []
    with live_server() as server, httpx.Client(timeout=30) as c:
        for headers, n, _ in sent:
            r = c.post(server.base_url + url, headers=headers,
                       json={"model": MODEL, "prompt": "hello there", "max_tokens": n,
                             "min_tokens": n})  # fmt: skip
            assert r.status_code == 200, r.text
            usage.append((r.json()["id"], r.json()["usage"]))
        bad = c.post(server.base_url + url, json={"model": "nope", "prompt": "x"})
        assert bad.status_code == 404
        text = c.get(server.url + "/metrics").text
    lines = [r.getMessage() for r in caplog.records if r.name == "sloserve.serve"]
    assert len(lines) == 4, lines
    for (rid, u), (_, n, met), line in zip(usage, sent, lines, strict=False):
        fields = dict(kv.split("=", 1) for kv in line.split()[1:])
        assert fields["id"] == rid and fields["model"] == MODEL and fields["status"] == "ok"
        assert int(fields["completion_tokens"]) == u["completion_tokens"] == n
        assert int(fields["prompt_tokens"]) == u["prompt_tokens"]
        assert 0 < float(fields["ttft_ms"]) <= float(fields["e2e_ms"])
        assert fields["slo_met"] == met
    assert re.search(r"model=nope status=rejected class=rt .*slo_met=-", lines[3])
    m = _samples(text)
    assert m[("sloserve_slo_attainment_total", (("class", "rt"), ("met", "true")))] == 1
    assert m[("sloserve_slo_attainment_total", (("class", "rt"), ("met", "false")))] == 1
    assert m[("sloserve_slo_attainment_total", (("class", "be"), ("met", "true")))] == 0
    assert m[("sloserve_generation_tokens_total", (("class", "rt"),))] == 5 + 6
    assert m[("sloserve_generation_tokens_total", (("class", "be"),))] == 7
    assert m[("sloserve_prompt_tokens_total", (("class", "rt"),))] == sum(
        u["prompt_tokens"] for _, u in usage[:2]
    )


def test_request_log_is_quiet_by_default_and_follows_log_level() -> None:
    assert log_config("warning")["loggers"]["sloserve.serve"]["level"] == "WARNING"
    assert log_config("info")["loggers"]["sloserve.serve"]["level"] == "INFO"
    assert log_config("trace")["loggers"]["sloserve.serve"]["level"] == "DEBUG"
    # uvicorn's own loggers are kept (the request log is added, nothing replaced)
    assert {"uvicorn", "uvicorn.error", "uvicorn.access"} <= set(log_config("info")["loggers"])
