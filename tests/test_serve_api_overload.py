"""Overload and departures at the gateway on 127.0.0.1: a full queue answers 429 with a
Retry-After never earlier than the backend asks, and a client that disconnects, while
streaming or still queued, leaves the engine at once and frees its KV cache."""

# ruff: noqa: F811 - the fixtures imported from serve_helpers are test parameters

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serve_helpers import (  # noqa: F401  (server: fixtures)
    MODEL,
    LiveServer,
    live_server,
    server,
)
from sloserve.serve.backend import ServeError
from sloserve.serve.emulated import EmulatedBackend


def test_queue_full_429() -> None:
    # R_max = 1: one request runs, one waits (max_queue=1), the third is dropped.
    from sloserve.experiments.runner import InstanceConfig

    icfg = InstanceConfig(profile="llama-2-7b@a100-80gb", max_running=1)
    with live_server(instance=icfg, max_queue=1, time_scale=1.0) as srv:
        url = f"{srv.base_url}/completions"
        long = {"model": MODEL, "prompt": "hi", "max_tokens": 100, "stream": True}
        # Response headers leave with the first token: the waiting one answers later.
        waiting = threading.Thread(target=lambda: httpx.post(url, json=long, timeout=30))
        with httpx.Client(timeout=10) as c1, c1.stream("POST", url, json=long) as r1:
            lines = r1.iter_lines()  # kept: a collected iterator closes the connection
            next(lines)  # the first is running
            waiting.start()
            deadline = time.monotonic() + 5
            while srv.backend.replicas()[0].waiting < 1:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            r3 = httpx.post(url, json={**long, "stream": False}, timeout=10)
            assert r3.status_code == 429
            assert r3.headers["retry-after"] == "1"
            assert r3.headers["x-sloserve-drop-reason"] == "queue_full"
            assert r3.json()["error"]["type"] == "rate_limit_error"
        waiting.join(timeout=30)
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert 'sloserve_requests_total{class="rt",status="dropped"} 1.0' in metrics


@pytest.mark.parametrize(("after", "header"), [(0.2, "1"), (1.0, "1"), (1.4, "2"), (2.5, "3")])
def test_retry_after_never_earlier_than_the_backend_asks(after: float, header: str) -> None:
    from sloserve.serve.api_errors import _serve_error

    e = _serve_error(ServeError("full", status=429, reason="queue_full", retry_after_s=after))
    assert e.headers["retry-after"] == header
    assert e.headers["x-sloserve-drop-reason"] == "queue_full"


def test_client_disconnect_frees_kv(server: LiveServer) -> None:
    be = server.backend
    url = f"{server.base_url}/completions"
    body = {"model": MODEL, "prompt": "x " * 500, "max_tokens": 3000, "stream": True}
    with httpx.Client(timeout=10) as c, c.stream("POST", url, json=body) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # three events with their blank lines
        assert sum(1 for ln in got if ln.startswith("data: ")) == 3
        (state,) = be.replicas()
        assert state.running == 1 and state.kv_usage > 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        (state,) = be.replicas()
        if state.kv_usage == 0 and state.running == 0 and state.in_flight == 0:
            break
        time.sleep(0.01)
    assert (state.kv_usage, state.running, state.in_flight) == (0.0, 0, 0)
    assert isinstance(be, EmulatedBackend)
    (inst,) = be.instances()
    assert inst.done[-1].status.name == "ABORTED" and inst.done[-1].num_output_tokens < 3000
    inst.kv.check_invariants()
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'sloserve_requests_total{class="rt",status="cancelled"} 1.0' in text


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_while_queued_leaves_the_engine(stream: bool) -> None:
    """A client that gives up before its first token (queued behind R_max) is removed from
    the engine's queue at once, not when its turn comes."""
    from sloserve.experiments.runner import InstanceConfig

    icfg = InstanceConfig(profile="llama-2-7b@a100-80gb", max_running=1)
    with live_server(instance=icfg, time_scale=1.0) as srv:
        be = srv.backend
        assert isinstance(be, EmulatedBackend)
        url = f"{srv.base_url}/completions"
        long = {"model": MODEL, "prompt": "hi", "max_tokens": 300, "stream": True}
        with httpx.Client(timeout=10) as c1, c1.stream("POST", url, json=long) as r1:
            lines = r1.iter_lines()
            next(lines)  # the first request runs (R_max = 1)
            with pytest.raises(httpx.ReadTimeout):  # the second waits, and its client leaves
                httpx.post(url, json={**long, "stream": stream}, timeout=0.3)
            deadline = time.monotonic() + 3
            while be.replicas()[0].waiting or be.replicas()[0].in_flight > 1:
                assert time.monotonic() < deadline, be.replicas()
                time.sleep(0.01)
            (inst,) = be.instances()
            (gone,) = inst.done
            assert gone.status.name == "ABORTED" and gone.num_output_tokens == 0
            assert inst.running[0].num_output_tokens < 300  # the first is still streaming
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert 'sloserve_requests_total{class="rt",status="cancelled"}' in text
