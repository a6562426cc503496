"""Slow and malformed clients: a deadline on reading each request, a body size bound, and
JSON error bodies where uvicorn would answer in plain text.

uvicorn bounds neither phase of reading a request by time: its ``timeout_keep_alive``
closes a connection idle *between* requests and is cancelled by the first byte of the next
one, and h11's ``h11_max_incomplete_event_size`` bounds the *size* of a header block, not
how long it takes. A client that sends part of its headers, or headers with
``Content-Length: 100`` and then nothing, held its connection (and, for the body, a task
of the app) forever. Two guards, one setting (``request_read_timeout_s``):

* **headers** (:class:`GuardedHttpToolsProtocol`, :class:`GuardedH11Protocol`: uvicorn's
  protocols with a timer): from the connection's first byte (or its opening, or the end of
  the previous response on a keep-alive connection) the whole header block must arrive
  within the deadline; otherwise the server writes a 408 with an OpenAI error body and
  closes. A header block uvicorn cannot parse gets a 400 JSON body instead of uvicorn's
  plain text.
* **body** (:func:`guard_receive`, applied by the app to every request with a body: an
  ASGI-level wrapper of ``receive``): from the moment the headers are in, the body must
  arrive within the deadline (408) and must not exceed ``max_body_bytes`` (413; a
  ``Content-Length`` over the bound is refused before anything is read). After the body,
  ``receive`` is unguarded: the gateway uses it to watch for a disconnect while it
  streams.

Each refusal is counted in ``sloserve_client_errors_total{reason}``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sloserve.serve.schemas import error_body

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class RequestReadTimeout(HTTPException):
    """The request's body did not arrive within the read deadline (408)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            408, f"the request was not received within {timeout_s:g} s (request_read_timeout_s)"
        )


class RequestTooLarge(HTTPException):
    """The request's body is over ``max_body_bytes`` (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over {limit} bytes (max_body_bytes)")


def guard_receive(
    receive: Receive, headers: list[tuple[bytes, bytes]], timeout_s: float, max_bytes: int
) -> Receive:
    """``receive`` with a deadline on the whole body and a bound on its size."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    declared = next((v for k, v in headers if k == b"content-length"), None)
    state = {"done": False, "size": 0, "checked": False}

    async def guarded() -> MutableMapping[str, Any]:
        if state["done"]:
            return await receive()
        if not state["checked"]:
            state["checked"] = True
            if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
                raise RequestTooLarge(max_bytes)
        try:
            async with asyncio.timeout_at(deadline):
                msg = await receive()
        except TimeoutError:
            raise RequestReadTimeout(timeout_s) from None
        if msg["type"] == "http.request":
            state["size"] += len(msg.get("body", b""))
            if state["size"] > max_bytes:
                raise RequestTooLarge(max_bytes)
            if not msg.get("more_body", False):
                state["done"] = True
        else:
            state["done"] = True  # a disconnect: nothing more will come
        return msg

    return guarded


def raw_error(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error response with an OpenAI error body, closing the connection
    (written straight to the transport where no ASGI app is running)."""
    body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def gateway_of(app: Any) -> Any:
    """The gateway app under uvicorn's middleware wrappers (``None`` if it is not one)."""
    for _ in range(16):
        if app is None:
            return None
        if getattr(getattr(app, "state", None), "settings", None) is not None:
            return app
        app = getattr(app, "app", None)
    return None


class _HeaderDeadline:
    """Mixin over a uvicorn HTTP protocol: a timer on each request's header block."""

    # provided by uvicorn's protocol classes
    app: Any
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    _gw: Any = None
    _timer: asyncio.TimerHandle | None = None
    _timer_cycle: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._gw = gateway_of(self.app)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)  # type: ignore[misc]
        if self._timer is not None and self.cycle is not self._timer_cycle:
            self._timer.cancel()  # the headers are in: the app's body guard takes over
            self._timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        if self._gw is None:
            return
        self._timer_cycle = self.cycle
        timeout = self._gw.state.settings.request_read_timeout_s
        self._timer = self.loop.call_later(timeout, self._expired, timeout)

    def _expired(self, timeout: float) -> None:
        self._timer = None
        if self.cycle is not self._timer_cycle or self.transport.is_closing():
            return
        self._gw.state.metrics.client_error("header_timeout")
        msg = f"the request headers were not received within {timeout:g} s"
        self.transport.write(raw_error(408, "Request Timeout", msg, "request_timeout"))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if self._gw is not None:
            self._gw.state.metrics.client_error("malformed_http")
        self.transport.write(raw_error(400, "Bad Request", msg, "malformed_http"))
        self.transport.close()


class GuardedH11Protocol(_HeaderDeadline, H11Protocol):
    """uvicorn's h11 protocol with the header deadline and JSON 400s."""


class GuardedHttpToolsProtocol(_HeaderDeadline, HttpToolsProtocol):
    """uvicorn's httptools protocol with the header deadline and JSON 400s."""
