"""Running the gateway under uvicorn: :class:`GatewayServer` and :func:`server_options`.

:class:`GatewayServer` starts the app's drain as soon as a shutdown starts, so streams still
open after ``drain_timeout_s`` end with an SSE error event and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TypedDict

import uvicorn


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


class GatewayServer(uvicorn.Server):
    """uvicorn's server, draining the gateway as soon as a shutdown starts.

    Plain uvicorn waits for open responses and, at ``timeout_graceful_shutdown``, cancels
    them (the client sees a cut connection) before the app hears of the shutdown. This one
    starts the app's drain (``app.state.drain``) beside that wait, so streams still open
    after ``drain_timeout_s`` end with an SSE error event and ``data: [DONE]``; give uvicorn
    a longer ``timeout_graceful_shutdown`` as a backstop.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drain = getattr(getattr(self.config.app, "state", None), "drain", None)
        task = asyncio.ensure_future(drain()) if drain is not None else None
        await super().shutdown(sockets)
        if task is not None:
            await task
