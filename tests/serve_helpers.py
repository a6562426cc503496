"""Shared by the serve tests: a real gateway on 127.0.0.1 (uvicorn in a thread, on a free
port) with the API tests' recording server, fixtures and backends, and the upstream tests'
fake OpenAI-compatible engine (FastAPI) with their request and backend helpers."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pandas as pd
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from sloserve.core.request import SLO, RequestClass
from sloserve.core.request import Request as TraceRequest
from sloserve.experiments.runner import InstanceConfig
from sloserve.serve.api import GatewaySettings, create_app
from sloserve.serve.backend import Backend, GenerationRequest, ReplicaState, ServeError, TokenChunk
from sloserve.serve.emulated import EmulatedBackend, EmulatedConfig
from sloserve.serve.schemas import filler_text
from sloserve.serve.server import GatewayServer, server_options
from sloserve.serve.upstream import OpenAIUpstreamBackend
from sloserve.serve.upstream_config import UpstreamConfig

MODEL = "llama-2-7b"


def emulated(cls: type[EmulatedBackend] = EmulatedBackend, **overrides: Any) -> EmulatedBackend:
    """An emulated llama-2-7b/A100 replica, 20x faster than real time (a decode step ~1 ms)."""
    fields: dict[str, Any] = {
        "instance": InstanceConfig(profile="llama-2-7b@a100-80gb"),
        "time_scale": 20.0,
        "served_model_name": MODEL,
    }
    fields.update(overrides)
    return cls(EmulatedConfig(**fields))


class LiveServer:
    """A running gateway: ``url`` (``http://127.0.0.1:PORT``), ``base_url`` (``…/v1``)."""

    def __init__(self, backend: Backend, server: uvicorn.Server, port: int) -> None:
        self.backend = backend
        self.server = server
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.url}/v1"


@contextmanager
def live_server(
    backend: Backend | None = None, settings: GatewaySettings | None = None, **kw: Any
) -> Iterator[LiveServer]:
    """Start the gateway in front of ``backend`` (default :func:`emulated`), yield, stop it."""
    be = backend or emulated(**kw)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    drain = (settings or GatewaySettings()).drain_timeout_s
    config = uvicorn.Config(
        create_app(be, settings), log_level="warning",
        timeout_graceful_shutdown=int(drain) + 5, lifespan="on", **server_options(),
    )  # fmt: skip
    server = GatewayServer(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.01)
    try:
        yield LiveServer(be, server, port)
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


async def replay_over_http(
    base_url: str,
    requests: Sequence[TraceRequest],
    time_scale: float,
    model: str = MODEL,
) -> pd.DataFrame:
    """Send ``requests`` to a gateway at their arrival times (divided by ``time_scale``) as
    streaming completions with token-id prompts of their exact prompt length and
    ``max_tokens`` their output length; one row per request with the TTFT and TPOT the
    client measured, in simulated seconds (wall times multiplied by ``time_scale``)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        t0 = time.monotonic() + 0.05

        async def one(r: TraceRequest) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, t0 + r.arrival / time_scale - time.monotonic()))
            # A first token of its own: the requests share no prefix (as the simulated
            # ones, which carry no prompt identity), so the engines' caches find none.
            body = {
                "model": model, "prompt": [1000 + r.req_id] + [7] * (r.num_prompt_tokens - 1),
                "max_tokens": r.true_output_len, "stream": True,
            }  # fmt: skip
            sent = time.monotonic()
            times: list[float] = []
            async with client.stream("POST", f"{base_url}/completions", json=body) as resp:
                if resp.status_code != 200:
                    raise RuntimeError(f"request {r.req_id}: HTTP {resp.status_code}")
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        times.append(time.monotonic())
            n = len(times)
            return {
                "req_id": r.req_id,
                "late_s": (sent - t0) * time_scale - r.arrival,
                "tokens": n,
                "ttft_s": (times[0] - sent) * time_scale,
                "tpot_s": (times[-1] - times[0]) / (n - 1) * time_scale if n > 1 else float("nan"),
            }

        rows = await asyncio.gather(*(one(r) for r in requests))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- the API tests
class RecordingBackend(EmulatedBackend):
    """The emulated backend, remembering the last request the API handed it."""

    last: GenerationRequest | None = None

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        self.last = req
        async for c in super().generate(req):
            yield c


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(emulated(RecordingBackend)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def expected_text(n: int) -> str:
    return "".join(filler_text(i) for i in range(n))


def sse_events(resp: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE response, in order (blank-line separated)."""
    raw = resp.text
    assert raw.endswith("\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


_MSG = [{"role": "user", "content": "hi"}]


class FlakyBackend(Backend):
    """Two tokens, then a failure; unhealthy when ``down``."""

    name = "flaky"

    def __init__(self) -> None:
        self.down = False
        self.closed = 0

    async def start(self) -> None:
        pass

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        pass

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        if self.down:
            raise ServeError("no upstream is healthy", status=503, reason="no_backend")
        try:
            yield TokenChunk(" a", 1)
            yield TokenChunk(" b", 1)
            raise ServeError("upstream connection reset", status=502, reason="upstream_failed")
        finally:
            self.closed += 1

    def replicas(self) -> Sequence[ReplicaState]:
        return [ReplicaState("up", not self.down, 0, 0, float("nan"))]


# ----------------------------------------------------------------------------- the upstream tests
class FakeEngine:
    """An OpenAI-compatible streaming server whose behaviour the test sets."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.mode = "ok"  # ok | status500 | status400 | drop | no_finish
        self.tokens = 4
        self.tokens_per_chunk = 1
        self.delay = 0.0
        self.drop_after = 1
        self.healthy = True
        self.metrics = ""
        self.disconnected = 0
        self.junk = "42"
        """What ``junk`` mode sends as its only SSE data (valid JSON, not a chunk object)."""
        app = FastAPI()

        @app.get("/health")
        async def health() -> Any:
            return PlainTextResponse("ok", status_code=200 if self.healthy else 503)

        @app.get("/metrics")
        async def metrics() -> Any:
            return PlainTextResponse(self.metrics)

        @app.get("/v1/models")
        async def models() -> Any:
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            return await self._answer(request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            return await self._answer(request, chat=True)

        self.app = app

    async def _answer(self, request: Request, chat: bool) -> Any:
        body = await request.json()
        self.bodies.append(body)
        if self.mode == "status500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if self.mode == "status400":
            return JSONResponse({"error": {"message": "bad max_tokens"}}, status_code=400)
        mode, n, per, delay, drop_after = (
            self.mode,
            self.tokens,
            self.tokens_per_chunk,
            self.delay,
            self.drop_after,
        )

        def chunk(text: str | None, finish: str | None) -> str:
            if chat:
                delta = {} if text is None else {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            return "data: " + json.dumps({"id": "x", "choices": [choice]}) + "\n\n"

        async def events() -> AsyncIterator[str]:
            try:
                if mode == "junk":
                    yield "data: " + self.junk + "\n\n"
                    return
                if chat:
                    yield (
                        "data: "
                        + json.dumps(
                            {
                                "choices": [
                                    {"index": 0, "delta": {"role": "assistant", "content": ""}}
                                ]
                            }
                        )
                        + "\n\n"
                    )
                for k in range(0, n, per):
                    if mode == "drop" and k >= drop_after:
                        raise RuntimeError("engine died")
                    if mode == "stall" and k >= drop_after:
                        await asyncio.sleep(30)  # alive but silent
                    await asyncio.sleep(delay)
                    yield chunk("t" * per, None)
                if mode == "no_finish":
                    return
                yield chunk(None, "length")
                usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": n + 7}
                yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"
            except asyncio.CancelledError:
                self.disconnected += 1
                raise

        return StreamingResponse(events(), media_type="text/event-stream")


def _serve(app: FastAPI, lifespan: str = "off") -> tuple[str, uvicorn.Server, threading.Thread]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan=lifespan))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "fake engine did not start"
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, t


@pytest.fixture(scope="module")
def engines() -> Iterator[list[tuple[str, FakeEngine]]]:
    out, servers = [], []
    for _ in range(2):
        fe = FakeEngine()
        url, server, t = _serve(fe.app)
        out.append((url, fe))
        servers.append((server, t))
    yield out
    for server, t in servers:
        server.should_exit = True
        t.join(5)


@pytest.fixture
def fakes(engines: list[tuple[str, FakeEngine]]) -> list[tuple[str, FakeEngine]]:
    for _, fe in engines:  # reset behaviour between tests (module-scoped servers)
        fe.bodies.clear()
        fe.mode, fe.tokens, fe.tokens_per_chunk, fe.delay = "ok", 4, 1, 0.0
        fe.healthy, fe.metrics, fe.disconnected, fe.drop_after = True, "", 0, 1
        fe.junk = "42"
    return engines


def greq(
    *,
    endpoint: str = "completions",
    prompt: int = 10,
    max_tokens: int = 4,
    priority: int = 0,
    slo: SLO | None = None,
    arrival: float | None = None,
    cls: RequestClass = RequestClass.RT,
    body: dict[str, Any] | None = None,
) -> GenerationRequest:
    return GenerationRequest(
        request_id="cmpl-t",
        endpoint=endpoint,  # type: ignore[arg-type]
        model="fake-model",
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        arrival=time.monotonic() if arrival is None else arrival,
        priority=priority,
        slo=slo or SLO(),
        request_class=cls,
        body=body if body is not None else {"model": "fake-model", "prompt": "hi"},
    )


async def collect(b: OpenAIUpstreamBackend, r: GenerationRequest) -> list[TokenChunk]:
    return [c async for c in b.generate(r)]


def run_backend(cfg: UpstreamConfig, fn: Any) -> Any:
    async def main() -> Any:
        b = OpenAIUpstreamBackend(cfg)
        await b.start()
        try:
            return await fn(b)
        finally:
            await b.stop(1.0)

    return asyncio.run(main())


def offline_backend(**kw: Any) -> OpenAIUpstreamBackend:
    kw.setdefault("upstreams", ("http://127.0.0.1:9",))
    kw.setdefault("max_concurrency", 1)
    kw.setdefault("health_interval_s", 0)
    return OpenAIUpstreamBackend(UpstreamConfig(**kw))


def grant_order(b: OpenAIUpstreamBackend, reqs: list[GenerationRequest]) -> list[int]:
    """Fill the only slot, queue ``reqs`` in list order, free slots one by one."""

    async def main() -> list[int]:
        blocker = greq()
        b._take(0, blocker)
        order: list[int] = []

        async def one(k: int, r: GenerationRequest) -> None:
            i = await b._acquire(r, frozenset())
            order.append(k)
            await asyncio.sleep(0.01)
            b._release(i, r, True)

        tasks = []
        for k, r in enumerate(reqs):
            tasks.append(asyncio.create_task(one(k, r)))
            await asyncio.sleep(0)
        assert b.queue_size == len(reqs)
        b._release(0, blocker, True)
        await asyncio.gather(*tasks)
        return order

    return asyncio.run(main())
