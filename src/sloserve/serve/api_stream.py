"""How the gateway writes responses and watches clients (Starlette/ASGI level).

:class:`_GatewayApp` keeps the server's raw ``send`` so token writes skip the middleware;
:class:`_SSEResponse` writes a server-sent-events stream from one writer task and cancels it
when the client leaves; :func:`_unless_disconnected` awaits the first token (or a whole
non-streaming answer) unless the client goes first; :func:`_backend_next`, :func:`_chain`,
:func:`_close` and :func:`_finish` wrap the backend's token iterator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response

from sloserve.serve.api_guard import guard_receive
from sloserve.serve.backend import ServeError, TokenChunk

_log = logging.getLogger(__name__)

T = TypeVar("T")


_DONE = "data: [DONE]\n\n"


_RAW_SEND = "sloserve.raw_send"
"""Scope key of the server's own ``send`` (stashed by :class:`_GatewayApp`)."""

_Write = Callable[[bytes], Awaitable[None]]


class _GatewayApp(FastAPI):
    """FastAPI, keeping the server's ``send`` in the scope: token writes skip the
    middleware layers (each wraps ``send`` in a coroutine of its own; per token that was a
    good share of the gateway's cost). The response start and end still go through them.
    A request with a body reads it through :func:`~sloserve.serve.api_guard.guard_receive`
    (the read deadline and the size bound)."""

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            scope[_RAW_SEND] = send
            if scope["method"] not in ("GET", "HEAD"):
                cfg = self.state.settings
                receive = guard_receive(
                    receive, scope["headers"], cfg.request_read_timeout_s, cfg.max_body_bytes
                )
        await super().__call__(scope, receive, send)


class _SSEResponse(Response):
    """A server-sent-events response written by ``run(write)``.

    Leaner than Starlette's ``StreamingResponse`` on the per-token path: no async
    iterator chain and no anyio task group around each write. A client disconnect is
    watched by one idle task that cancels the writer, whose ``finally`` closes the
    backend's stream (abort, free KV) and records the request as cancelled.
    """

    media_type = "text/event-stream"

    def __init__(self, run: Callable[[_Write], Awaitable[None]], headers: dict[str, str]) -> None:
        # Not Response.__init__: that would set a body and a content-length.
        self.status_code = 200
        self.background = None
        self._run = run
        self.init_headers(headers)

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        raw = scope.get(_RAW_SEND, send)

        async def write(data: bytes) -> None:
            await raw({"type": "http.response.body", "body": data, "more_body": True})

        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        # The writer runs in a task of its own: each token wakes a shallow coroutine stack,
        # not the request's (a dozen middleware frames deep, each resumed per wake-up).
        writer = asyncio.ensure_future(self._run(write))

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            writer.cancel()  # the client left: its finally closes the backend's stream

        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait((writer,))  # returns, not raises, when the writer is cancelled
        except asyncio.CancelledError:
            writer.cancel()  # this handler was cancelled (server shutdown): stop writing
            await asyncio.gather(writer, return_exceptions=True)
            raise
        finally:
            watcher.cancel()
        if writer.cancelled():
            return  # the client is gone: nothing more to send
        writer.result()  # re-raise a failure of the writer
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Disconnected(Exception):
    """The client closed the connection before the response started."""


async def _backend_next(nxt: Callable[[], Awaitable[TokenChunk]]) -> TokenChunk:
    """The backend's next chunk; a bug in a backend (any exception but the contract's
    :class:`ServeError`) becomes a ``ServeError`` too, so that the stream still ends with
    an explicit error event and ``[DONE]`` instead of being cut."""
    try:
        return await nxt()
    except (ServeError, StopAsyncIteration, asyncio.CancelledError):
        raise
    except Exception as e:
        _log.exception("backend failed mid-stream")
        raise ServeError(
            f"internal error in the backend: {type(e).__name__}: {e}", status=500, reason="internal"
        ) from e


async def _unless_disconnected(request: Request, aw: Awaitable[T]) -> T:
    """Await ``aw`` unless the client disconnects first; then cancel it (the backend's
    generator runs its cleanup: the request leaves the engine or the upstream) and raise
    :class:`_Disconnected`. Without this, a request waiting for its first token, or a
    non-streaming one, would hold its place until it produced output nobody reads."""
    task = asyncio.ensure_future(aw)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():  # the client went away, or this handler was cancelled
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    if task.cancelled():
        raise _Disconnected
    return task.result()


def _finish(chunk: TokenChunk) -> str | None:
    # "abort" is the contract's word for a request the engine gave up: OpenAI has no such
    # finish reason, and a stream that ends that way is reported as an error instead.
    if chunk.finish_reason == "abort":
        raise ServeError("the backend aborted the request", reason="aborted")
    return chunk.finish_reason


async def _chain(first: TokenChunk, rest: AsyncIterator[TokenChunk]) -> AsyncIterator[TokenChunk]:
    yield first
    if first.finish_reason is not None:
        return
    async for c in rest:
        yield c


async def _close(*its: AsyncIterator[TokenChunk]) -> None:
    for it in its:
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()
