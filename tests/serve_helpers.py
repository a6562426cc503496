"""A real gateway on 127.0.0.1 for the serve tests: uvicorn in a thread, on a free port."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pandas as pd
import uvicorn

from sloserve.core.request import Request
from sloserve.experiments.runner import InstanceConfig
from sloserve.serve.api import GatewaySettings, create_app
from sloserve.serve.backend import Backend
from sloserve.serve.emulated import EmulatedBackend, EmulatedConfig
from sloserve.serve.server import GatewayServer, server_options

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
    requests: Sequence[Request],
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

        async def one(r: Request) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, t0 + r.arrival / time_scale - time.monotonic()))
            body = {
                "model": model, "prompt": [7] * r.num_prompt_tokens,
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
