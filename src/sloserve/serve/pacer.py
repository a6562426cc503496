"""Andes' client-side token pacer (§5): smooth a bursty token stream to the reader's speed.

A server that preempts requests delivers tokens in bursts; the pacer buffers them and
releases one token every ``1/tokens_per_s`` seconds, never before it arrived. Release
times follow exactly the consumption timeline of Andes' QoE (see
:func:`sloserve.metrics.qoe.consumption_times`): ``r_i = max(d_i, r_{i-1} + 1/s)``, the
first token released on arrival (or at ``first_at``). So a server that keeps ahead of the
reader is invisible to the user, and the simulator's QoE is the QoE a paced client sees.

Works on any async iterator of items: raw tokens, text chunks, or OpenAI streaming chunks
(``weight`` tells how many tokens an item carries, e.g. a chunk's token count).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_DONE = object()


class TokenPacer(Generic[T]):
    """An async iterator that re-times ``source`` to ``tokens_per_s``.

    The source is drained in the background as fast as it produces (so the server side
    is never slowed down); items come out at the reading speed. Errors from the source
    are raised to the reader after the items that preceded them.
    """

    def __init__(
        self,
        source: AsyncIterator[T],
        tokens_per_s: float,
        *,
        weight: Callable[[T], float] | None = None,
        first_at: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not tokens_per_s > 0:
            raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
        self._source = source
        self._gap = 1.0 / tokens_per_s
        self._weight = weight
        self._next_at = first_at
        self._clock = clock
        self._sleep = sleep
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.delivered: list[float] = []
        """When each item arrived from the source."""
        self.released: list[float] = []
        """When each item was handed to the reader."""

    async def _drain(self) -> None:
        try:
            async for item in self._source:
                self.delivered.append(self._clock())
                await self._queue.put(item)
        except Exception as e:  # handed to the reader in order
            await self._queue.put(e)
        finally:
            await self._queue.put(_DONE)

    def __aiter__(self) -> TokenPacer[T]:
        return self

    async def __anext__(self) -> T:
        if self._task is None:
            self._task = asyncio.ensure_future(self._drain())
        item = await self._queue.get()
        if item is _DONE:
            raise StopAsyncIteration
        if isinstance(item, Exception):
            raise item
        now = self._clock()
        if self._next_at is not None and self._next_at > now:
            await self._sleep(self._next_at - now)
            now = self._clock()
        self.released.append(now)
        w = self._weight(item) if self._weight is not None else 1.0  # type: ignore[arg-type]
        self._next_at = max(now, self._next_at or now) + w * self._gap
        return item  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Stop reading the source (e.g. the user closed the page)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()


def pace(
    source: AsyncIterator[T], tokens_per_s: float, *, weight: Callable[[T], float] | None = None
) -> TokenPacer[T]:
    """``async for tok in pace(stream, 4.8): ...`` — release ``stream`` at reading speed."""
    return TokenPacer(source, tokens_per_s, weight=weight)


def openai_chunk_tokens(chunk: object) -> float:
    """Tokens in an OpenAI streaming chunk (a dict or SDK object): 1 per non-empty delta,
    as servers stream one token per chunk; 0 for role-only or usage-only chunks."""
    choices = chunk.get("choices") if isinstance(chunk, dict) else getattr(chunk, "choices", None)
    if not choices:
        return 0.0
    c0 = choices[0]
    delta = c0.get("delta") if isinstance(c0, dict) else getattr(c0, "delta", None)
    text = c0.get("text") if isinstance(c0, dict) else getattr(c0, "text", None)
    if delta is not None:
        content = (
            delta.get("content") if isinstance(delta, dict) else getattr(delta, "content", None)
        )
        return 1.0 if content else 0.0
    return 1.0 if text else 0.0
