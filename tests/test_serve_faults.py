"""Faults with real processes: emulated sloserve servers as upstreams, one killed mid-run.

Checks the issue's fault contract: nothing hangs, every request ends with its tokens or an
explicit error, the killed upstream's circuit breaker opens, and after the upstream comes
back the breaker closes and it serves again. Then the same through a gateway process
(``sloserve serve --backend openai``) with the ``openai`` SDK and raw SSE streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

import httpx

from sloserve.serve.backend import GenerationRequest, ServeError
from sloserve.serve.breaker import BreakerState
from sloserve.serve.upstream import OpenAIUpstreamBackend
from sloserve.serve.upstream_config import UpstreamConfig

MODEL = "llama-2-7b"
TOKENS = 30
"""Output tokens per request: about 0.5 s of emulated decode on a 7B/A100 profile."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "sloserve.cli", "serve", "--log-level", "error", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )


def emulated(port: int) -> subprocess.Popen[bytes]:
    return spawn("--backend", "emulated", "--port", str(port), "--model", MODEL)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"server exited with {proc.returncode}: {err[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"{url} did not become healthy in {timeout} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; all stopped at the end, whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        stop(p)


def greq(k: int) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"cmpl-{k}",
        endpoint="completions",
        model=MODEL,
        prompt_tokens=8,
        max_tokens=TOKENS,
        arrival=time.monotonic(),
        body={"model": MODEL, "prompt": "tell me a story", "max_tokens": TOKENS},
    )


def test_upstream_killed_mid_run_breaker_opens_and_recovers(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs += [emulated(p) for p in ports]
    for url, p in zip(urls, procs, strict=True):
        wait_healthy(url, p)
    cfg = UpstreamConfig(
        upstreams=tuple(urls),
        router="round-robin",
        max_concurrency=16,
        retries=2,
        breaker_failures=2,
        breaker_open_s=1.0,
        health_interval_s=0.25,
        connect_timeout_s=1.0,
        read_timeout_s=5.0,
    )

    async def scenario() -> dict[str, Any]:
        b = OpenAIUpstreamBackend(cfg)
        await b.start()
        victim = b.breakers()[urls[1]]

        async def client(k: int) -> tuple[str, Any]:
            await asyncio.sleep(k * 0.04)
            tokens = 0
            try:
                async for c in b.generate(greq(k)):
                    tokens += c.num_tokens
                    if c.finish_reason is not None:
                        return ("ok", (tokens, c.finish_reason))
                return ("vanished", tokens)
            except ServeError as e:
                return ("error", (e.status, e.reason, tokens))

        async def killer() -> None:
            await asyncio.sleep(0.8)
            procs[1].kill()  # SIGKILL: connections drop, no graceful drain

        t0 = time.monotonic()
        results, _ = await asyncio.wait_for(
            asyncio.gather(asyncio.gather(*(client(k) for k in range(40))), killer()), 30
        )
        run_s = time.monotonic() - t0
        opened = victim.times_opened
        await asyncio.sleep(0.4)  # a health check or two
        down = b.replicas()[1].healthy
        # Bring the upstream back on the same port; the breaker lets a probe through after
        # its cool-down and closes on the probe's success.
        procs[1].wait(5)
        procs.append(emulated(ports[1]))
        await asyncio.to_thread(wait_healthy, urls[1], procs[-1])
        served_before = b._ups[1].served
        recovered_in = None
        t1 = time.monotonic()
        while time.monotonic() - t1 < 15:
            await asyncio.gather(*(client(0) for _ in range(2)))
            if b._ups[1].served > served_before and victim.state is BreakerState.CLOSED:
                recovered_in = time.monotonic() - t1
                break
            await asyncio.sleep(0.1)
        await b.stop(2.0)
        return {
            "results": results,
            "opened": opened,
            "down": down,
            "recovered_in": recovered_in,
            "run_s": run_s,
            "in_flight": b.in_flight,
        }

    out = asyncio.run(scenario())
    results = out["results"]
    kinds = [k for k, _ in results]
    assert len(results) == 40 and "vanished" not in kinds
    ok = [v for k, v in results if k == "ok"]
    errors = [v for k, v in results if k == "error"]
    assert all(v == (TOKENS, "length") for v in ok)
    # Streams cut by the kill end with an explicit mid-stream error after some tokens;
    # requests not yet started there were retried on the live upstream.
    assert errors, "the kill should cut some streams"
    assert all(status == 502 and reason == "upstream_error" for status, reason, _ in errors), errors
    assert len(ok) >= 25
    assert out["opened"] >= 1 and out["down"] is False
    assert out["recovered_in"] is not None, "the breaker did not close after the restart"
    assert out["in_flight"] == 0


def sse_events(lines: list[str]) -> list[Any]:
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_gateway_process_in_front_of_emulated_upstreams(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    openai = pytest.importorskip("openai")
    ports = [free_port(), free_port(), free_port()]
    up = [f"http://127.0.0.1:{p}" for p in ports[:2]]
    gw = f"http://127.0.0.1:{ports[2]}"
    procs += [emulated(p) for p in ports[:2]]
    gw_args = ["--backend", "openai", "--upstream", up[0], "--upstream", up[1]]
    gw_args += ["--router", "least-loaded", "--port", str(ports[2]), "--max-concurrency", "8"]
    procs.append(spawn(*gw_args))
    for url, p in zip([*up, gw], procs, strict=True):
        wait_healthy(url, p)

    client = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0)
    # Non-streaming and streaming, both endpoints, through gateway and upstream.
    r = client.completions.create(model=MODEL, prompt="hello", max_tokens=5)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(text) == 7
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    assert [m.id for m in client.models.list().data] == [MODEL]

    # Kill one upstream while 24 streams run through the gateway: every stream ends, with
    # [DONE] after its tokens or after an explicit error event.
    async def one(c: Any, k: int) -> list[Any]:
        await asyncio.sleep(k * 0.03)
        body = {"model": MODEL, "prompt": "story", "max_tokens": TOKENS, "stream": True}
        async with c.stream("POST", gw + "/v1/completions", json=body) as resp:
            # One upstream stays alive all along, so no stream is refused: the gateway
            # re-checks before a 503 ``no_backend`` (it once refused queued streams
            # because the survivor had been checked before it started listening).
            assert resp.status_code == 200, (resp.status_code, await resp.aread())
            return sse_events([line async for line in resp.aiter_lines()])

    async def run_all() -> list[list[Any]]:
        async with httpx.AsyncClient(timeout=20) as c:

            async def killer() -> None:
                await asyncio.sleep(0.7)
                procs[1].kill()

            results, _ = await asyncio.wait_for(
                asyncio.gather(asyncio.gather(*(one(c, k) for k in range(24))), killer()), 30
            )
            return results

    outcomes = asyncio.run(run_all())
    n_ok = n_err = 0
    for events in outcomes:
        assert events[-1] == "[DONE]"
        body = events[:-1]
        if any("error" in e for e in body):
            n_err += 1
            assert "error" in body[-1] and body[-1]["error"]["code"] == "upstream_error"
        else:
            n_ok += 1
            assert sum(len(e["choices"]) and e["choices"][0]["text"] != "" for e in body) == TOKENS
            assert body[-1]["choices"][0]["finish_reason"] == "length"
    assert n_ok + n_err == 24 and n_ok >= 12

    # With both upstreams down the gateway answers 503 naming the cause, quickly.
    procs[0].kill()
    deadline = time.monotonic() + 10
    while True:
        resp = httpx.post(
            gw + "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 2},
            timeout=10,
        )
        if resp.status_code == 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert resp.status_code == 503
    assert resp.headers["x-sloserve-drop-reason"] == "no_backend"
    assert "retry-after" in resp.headers
