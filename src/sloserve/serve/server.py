"""Running the gateway under uvicorn: :class:`GatewayServer`, :func:`server_options` and
:func:`run_workers`.

:class:`GatewayServer` starts the app's drain as soon as a shutdown starts, so streams still
open after ``drain_timeout_s`` end with an SSE error event and ``data: [DONE]``.

**Several gateway processes** (:func:`run_workers`, ``sloserve serve --workers N``, the
``openai`` backend only): a small supervisor spawns N processes that accept on one
listening socket (a crashed one is replaced); each builds its app with
:func:`worker_app` from the options the parent put in ``SLOSERVE_GATEWAY_WORKER``.
Each process has its **own** gateway queue, breakers,
router state, upstream connection pools and health checks: ``--max-queue`` and
``--max-concurrency`` hold per process (N processes admit up to N times as many), and a
breaker opened in one process does not open in the others. Metrics are aggregated over the
processes (prometheus-client's multiprocess mode in a temporary ``PROMETHEUS_MULTIPROC_DIR``
the parent creates and removes): counters and histograms are sums over all workers, the
queue and replica gauges are those of the process that answers the scrape. The emulated
backend stays one process: its engines live in the process.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import tempfile
from typing import Any, TypedDict

import uvicorn

from sloserve.serve.api_guard import gateway_of

WORKER_ENV = "SLOSERVE_GATEWAY_WORKER"
"""The options a worker process builds its app from (JSON: settings and upstream config)."""


class ServerOptions(TypedDict):
    """uvicorn ``Config`` keywords: ``uvicorn.Config(app, **server_options())``."""

    loop: str
    http: type[asyncio.Protocol]


def server_options() -> ServerOptions:
    """uvicorn's fastest event loop and HTTP parser when installed (``uvloop``,
    ``httptools``: the ``serve`` extra), else the pure-Python ones; the HTTP protocol is
    uvicorn's with the gateway's header deadline (:mod:`~sloserve.serve.api_guard`)."""
    from importlib.util import find_spec

    from sloserve.serve.api_guard import GuardedH11Protocol, GuardedHttpToolsProtocol

    http = GuardedHttpToolsProtocol if find_spec("httptools") else GuardedH11Protocol
    return {"loop": "uvloop" if find_spec("uvloop") else "asyncio", "http": http}


def log_config(log_level: str) -> dict[str, Any]:
    """uvicorn's logging config plus the gateway's request log (logger ``sloserve.serve``,
    one line per request at INFO) on uvicorn's stderr handler, at ``log_level``: shown
    with ``--log-level info`` or ``debug``, hidden at the default ``warning``."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    level = "DEBUG" if log_level.lower() == "trace" else log_level.upper()
    cfg["loggers"]["sloserve.serve"] = {"handlers": ["default"], "level": level, "propagate": False}
    return cfg


class GatewayServer(uvicorn.Server):
    """uvicorn's server, draining the gateway as soon as a shutdown starts.

    Plain uvicorn waits for open responses and, at ``timeout_graceful_shutdown``, cancels
    them (the client sees a cut connection) before the app hears of the shutdown. This one
    starts the app's drain (``app.state.drain``) beside that wait, so streams still open
    after ``drain_timeout_s`` end with an SSE error event and ``data: [DONE]``; give uvicorn
    a longer ``timeout_graceful_shutdown`` as a backstop.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        gw = gateway_of(self.config.loaded_app) if self.config.loaded else None
        drain = getattr(getattr(gw or self.config.app, "state", None), "drain", None)
        task = asyncio.ensure_future(drain()) if drain is not None else None
        await super().shutdown(sockets)
        if task is not None:
            await task


def worker_app() -> Any:
    """The app of one worker process (uvicorn's factory; options from :data:`WORKER_ENV`)."""
    from sloserve.serve.api import GatewaySettings, create_app
    from sloserve.serve.upstream import OpenAIUpstreamBackend
    from sloserve.serve.upstream_config import UpstreamConfig

    spec = json.loads(os.environ[WORKER_ENV])
    backend = OpenAIUpstreamBackend(UpstreamConfig.model_validate(spec["upstream"]))
    return create_app(backend, GatewaySettings.model_validate(spec["settings"]))


def _worker(config: uvicorn.Config, sock: socket.socket) -> None:
    """One worker process: the gateway on the shared listening socket."""
    config.configure_logging()  # a spawned process starts with logging unconfigured
    GatewayServer(config).run(sockets=[sock])


def run_workers(
    settings: Any, upstream: Any, host: str, port: int, log_level: str = "warning"
) -> None:
    """Serve the ``openai`` backend from ``settings.workers`` processes on one port (see
    the module docstring); returns when they have shut down (SIGINT/SIGTERM).

    A small supervisor rather than uvicorn's (whose workers run plain ``uvicorn.Server``,
    without the gateway's drain): spawned processes accept on one socket; a worker that
    dies is replaced; a signal is passed on to every worker, which drains as one server
    does."""
    import multiprocessing
    import signal
    import threading

    metrics_dir = tempfile.mkdtemp(prefix="sloserve-metrics-")
    saved = {k: os.environ.get(k) for k in (WORKER_ENV, "PROMETHEUS_MULTIPROC_DIR")}
    os.environ[WORKER_ENV] = json.dumps(
        {"settings": settings.model_dump(mode="json"), "upstream": upstream.model_dump(mode="json")}
    )
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # the spawned workers inherit it
    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    ctx = multiprocessing.get_context("spawn")  # no inherited event loop or threads
    try:
        config = uvicorn.Config(
            "sloserve.serve.server:worker_app", factory=True, host=host, port=port,
            log_level=log_level, timeout_graceful_shutdown=int(settings.drain_timeout_s) + 5,
            log_config=log_config(log_level), **server_options(),
        )  # fmt: skip
        sock = config.bind_socket()
        procs = [ctx.Process(target=_worker, args=(config, sock)) for _ in range(settings.workers)]
        for proc in procs:
            proc.start()
        while not stop.wait(0.5):
            for i, proc in enumerate(procs):
                if not proc.is_alive():  # crashed: replace it, as uvicorn's supervisor does
                    procs[i] = ctx.Process(target=_worker, args=(config, sock))
                    procs[i].start()
        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.join(settings.drain_timeout_s + 10)
        sock.close()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(metrics_dir, ignore_errors=True)
