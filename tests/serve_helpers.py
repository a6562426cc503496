"""A real gateway on 127.0.0.1 for the serve tests: uvicorn in a thread, on a free port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from sloserve.experiments.runner import InstanceConfig
from sloserve.serve.api import GatewaySettings, create_app
from sloserve.serve.backend import Backend
from sloserve.serve.emulated import EmulatedBackend, EmulatedConfig

MODEL = "llama-2-7b"


def emulated(**overrides: Any) -> EmulatedBackend:
    """An emulated llama-2-7b/A100 replica, 20x faster than real time (a decode step ~1 ms)."""
    fields: dict[str, Any] = {
        "instance": InstanceConfig(profile="llama-2-7b@a100-80gb"),
        "time_scale": 20.0,
        "served_model_name": MODEL,
    }
    fields.update(overrides)
    return EmulatedBackend(EmulatedConfig(**fields))


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
    config = uvicorn.Config(
        create_app(be, settings), log_level="warning", timeout_graceful_shutdown=5,
        lifespan="on",
    )  # fmt: skip
    server = uvicorn.Server(config)
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
