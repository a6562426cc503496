"""Streams that cannot finish, against a real server on 127.0.0.1: a backend that fails
mid-stream or has no healthy upstream (502/503), a bug in a backend (500), and a
server shutting down. Each stream ends with an explicit error event and [DONE], never
silently cut; a graceful shutdown drains the streams first."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from serve_helpers import _MSG, MODEL, FlakyBackend, live_server, sse_events
from sloserve.serve.api import GatewaySettings
from sloserve.serve.backend import GenerationRequest, TokenChunk


def test_mid_stream_failure_and_no_backend() -> None:
    be = FlakyBackend()
    with live_server(be) as srv:
        url = f"{srv.base_url}/chat/completions"
        body = {"model": "any", "messages": _MSG, "stream": True}
        r = httpx.post(url, json=body, timeout=10)
        assert r.status_code == 200
        events = sse_events(r)
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])
        assert err["error"]["code"] == "upstream_failed" and "reset" in err["error"]["message"]
        assert [json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:3]] == [
            " a", " b",
        ]  # fmt: skip
        r = httpx.post(url, json={**body, "stream": False}, timeout=10)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_failed"
        be.down = True
        r = httpx.post(url, json=body, timeout=10)
        assert r.status_code == 503
        assert r.headers["x-sloserve-drop-reason"] == "no_backend"
        assert r.json()["error"]["type"] == "service_unavailable_error"
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 503
        assert be.closed == 2  # both accepted streams were closed
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert 'sloserve_requests_total{class="rt",status="error"} 2.0' in text
        assert 'sloserve_requests_total{class="rt",status="unavailable"} 1.0' in text


class BuggyBackend(FlakyBackend):
    """Two tokens, then an exception outside the contract (a bug in the backend)."""

    bug_first = False

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        if self.bug_first:
            raise KeyError("before the first token")
        try:
            yield TokenChunk(" a", 1)
            yield TokenChunk(" b", 1)
            raise KeyError("oops")
        finally:
            self.closed += 1


def test_a_backend_bug_mid_stream_still_ends_with_an_error_event() -> None:
    be = BuggyBackend()
    with live_server(be) as srv:
        body = {"model": "any", "prompt": "hi", "stream": True}
        r = httpx.post(f"{srv.base_url}/completions", json=body, timeout=10)
        events = sse_events(r)
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == "internal" and "KeyError" in err["message"]
        assert be.closed == 1
        # and the server still serves
        r = httpx.post(f"{srv.base_url}/completions", json={**body, "stream": False}, timeout=10)
        assert r.status_code == 500 and r.json()["error"]["message"]
        assert be.closed == 2
        be.bug_first = True  # and a bug before the first token
        r = httpx.post(f"{srv.base_url}/completions", json=body, timeout=10)
        assert r.status_code == 500 and r.json()["error"]["message"]
        # each request counted once, as an error (not cancelled, not missing)
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert 'sloserve_requests_total{class="rt",status="error"} 3.0' in text
        assert 'sloserve_requests_total{class="rt",status="cancelled"} 0.0' in text


def _shut_down_while_streaming(srv: Any, max_tokens: int) -> tuple[list[str], float]:
    """Stream one completion in a thread, shut the server down (what SIGTERM does) once
    the request is in flight, and return its SSE data lines and the seconds the stream
    took to end after the shutdown began."""
    result: dict[str, list[str]] = {}
    url = f"{srv.base_url}/completions"

    def client() -> None:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": max_tokens, "stream": True}
        with httpx.stream("POST", url, json=body, timeout=20) as r:
            result["events"] = [ln for ln in r.iter_lines() if ln.startswith("data: ")]

    t = threading.Thread(target=client)
    t.start()
    deadline = time.monotonic() + 5
    while not any(s.in_flight for s in srv.backend.replicas()):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    t0 = time.monotonic()
    srv.server.should_exit = True  # the context manager then joins the server
    t.join(timeout=20)
    return result["events"], time.monotonic() - t0


def test_graceful_shutdown_drains_streams() -> None:
    with live_server(time_scale=1.0) as srv:
        events, _ = _shut_down_while_streaming(srv, 60)
    assert events[-1] == "data: [DONE]" and len(events) == 61  # every token, then [DONE]


def test_shutdown_ends_undrained_streams_explicitly() -> None:
    with live_server(settings=GatewaySettings(drain_timeout_s=0.3), time_scale=1.0) as srv:
        events, took = _shut_down_while_streaming(srv, 3000)
        assert took < 3  # the drain timeout, not the 3000 tokens (30 s)
    assert events[-1] == "data: [DONE]"
    err = json.loads(events[-2][len("data: ") :])["error"]
    assert err["code"] == "shutdown" and "shutting down" in err["message"]
    assert 3 < len(events) - 2 < 3000  # some tokens, then the error
