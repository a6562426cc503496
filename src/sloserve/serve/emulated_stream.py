"""The emulated backend's token streams: what the engine pushes and the API reads.

:class:`_Stream` is one request's token buffer (a deque and one future rather than an
``asyncio.Queue``: this is the per-token path); :class:`_TokenStream` is what
:meth:`~sloserve.serve.emulated.EmulatedBackend.generate` returns.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from sloserve.core.request import Request
from sloserve.serve.backend import GenerationRequest, ServeError, TokenChunk
from sloserve.serve.schemas import FILLER_WORDS, filler_text

if TYPE_CHECKING:
    from sloserve.serve.emulated import EmulatedBackend

_FILLER_CHUNKS = tuple(TokenChunk(filler_text(i), 1) for i in range(len(FILLER_WORDS)))
"""The chunks of non-final filler tokens (token ``i`` is ``_FILLER_CHUNKS[i % 16]``)."""


class _Stream:
    """One request's token buffer: the engine pushes, its :class:`_TokenStream` pops.

    A deque and one future rather than an ``asyncio.Queue``: this is the per-token path."""

    __slots__ = (
        "finish", "items", "max_tokens", "prompt_tokens", "req", "request_id", "sent",
        "sheddable", "waiter",
    )  # fmt: skip

    def __init__(
        self,
        req: Request,
        request_id: str,
        max_tokens: int,
        prompt_tokens: int,
        sheddable: bool = False,
    ) -> None:
        self.req = req
        self.sheddable = sheddable
        """Dropped first when the queue is full (:mod:`~sloserve.serve.emulated_admission`)."""
        self.request_id = request_id
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.items: deque[TokenChunk | ServeError] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.sent = 0
        self.finish = False

    def wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    def push(self, item: TokenChunk | ServeError) -> None:
        self.items.append(item)
        self.wake()


class _TokenStream:
    """What :meth:`EmulatedBackend.generate` returns: the request's chunks, in order.

    Admission runs at the first ``__anext__`` (errors come before the first chunk, as the
    contract says). :meth:`drain_nowait` hands over the chunks already produced without
    waiting, so that the API can write a backlog (a gateway that fell behind) in one go.
    Closing it (``aclose``), or an exception or cancellation while waiting, releases the
    request: aborted in the engine if it is still live.
    """

    __slots__ = ("_backend", "_closed", "_req", "_stream")

    def __init__(self, backend: EmulatedBackend, req: GenerationRequest) -> None:
        self._backend = backend
        self._req = req
        self._stream: _Stream | None = None
        self._closed = False

    def __aiter__(self) -> _TokenStream:
        return self

    async def __anext__(self) -> TokenChunk:
        s = self._stream
        if s is None:
            if self._closed:
                raise StopAsyncIteration
            s = await self._backend.admit(self._req)
            self._stream = s
        items = s.items
        try:
            while not items:
                if self._closed:
                    raise StopAsyncIteration
                s.waiter = self._backend.loop.create_future()
                await s.waiter
        except BaseException:
            self._close()
            raise
        item = items.popleft()
        if isinstance(item, ServeError):
            self._close()
            raise item
        if item.finish_reason is not None:
            self._close()
        return item

    def drain_nowait(self) -> list[TokenChunk]:
        """The chunks already produced (up to an error, which the next ``__anext__`` raises)."""
        s = self._stream
        out: list[TokenChunk] = []
        if s is None:
            return out
        items = s.items
        while items and not isinstance(items[0], ServeError):
            c = items.popleft()
            assert isinstance(c, TokenChunk)
            out.append(c)
            if c.finish_reason is not None:
                self._close()
                break
        return out

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            self._backend.release(self._stream)
