"""The ``openai`` backend: a gateway in front of OpenAI-compatible engines (vLLM, SGLang…).

The gateway owns what an engine cannot see across replicas: it **queues** requests and
orders them (``fcfs``, ``priority``, ``edf``), **limits concurrency** per upstream (so the
engines' own queues stay short and the gateway's ordering decides), **routes** with a
:mod:`~sloserve.cluster.routing` router (the simulated cluster's very objects; a
:class:`~sloserve.cluster.routing.Hold` keeps the request in the gateway's queue),
**admits** or rejects, **retries** failed sends, trips a per-upstream **circuit breaker**
and **health-checks**. Each request is forwarded as a
streaming request (``stream: true`` with usage), whatever the client asked: the API layer
rebuilds a non-streaming answer from the chunks.

Choices (all parameters of :class:`UpstreamConfig`):

- **Queue order.** ``fcfs``: arrival. ``priority``: the request's ``priority`` (lower
  first, as vLLM), then arrival. ``edf``: least slack first. A request's deadline is its
  end-to-end ``slo.deadline_ms`` if any, else its TTFT target (arrival + ``ttft_ms``);
  slack subtracts the cost model's estimate of the work still needed before that deadline
  (prefill, plus ``max_tokens`` decode steps for an end-to-end deadline) when a
  ``profile`` is configured; without one it is plain EDF. Requests without any deadline
  come after those with one, in arrival order.
- **Admission.** ``none``: never reject for load (the queue is unbounded). ``queue``: 429
  ``queue_full`` when ``max_queue`` requests already wait. ``slo``: also 429 ``deadline``
  for real-time requests whose TTFT target or deadline can no longer be met — at arrival,
  when the estimated queueing delay plus the best upstream's estimated TTFT exceeds it,
  and while queued, as soon as the time left is below the estimated TTFT. Estimates come
  from the cost model of ``profile`` when given, else from TTFTs observed at each upstream
  (an exponential moving average while it has requests in flight, the smallest TTFT seen
  there when it is idle). Best-effort requests are never rejected for SLOs.
  ``Retry-After`` is the estimated time for the queue to drain by one position per free
  slot. 503 ``no_backend`` when no upstream is healthy.
- **Retries.** Only while nothing has been sent to the caller: a connection error, a
  timeout, a 5xx/429 answer or a stream that breaks before its first token is retried (up
  to ``retries`` times) on another upstream when one is healthy. A 4xx (other than 408 and
  429) is the request's fault, passed through and never retried. After the first token a
  failure ends the stream with :class:`ServeError` (the API sends an error event).
- **Health.** Every ``health_interval_s`` the gateway GETs ``/health`` (a refused
  connection or an error status marks the upstream unhealthy, one success healthy again: a
  killed engine stops getting traffic within one interval; a timed-out check counts only
  after ``health_timeouts`` in a row, or a busy engine on a loaded host would be taken
  for dead), ``/metrics`` (engine load, see :mod:`~sloserve.serve.scrape`) and, until it
  knows them, ``/v1/models``. Before a request is refused with 503 ``no_backend`` the
  gateway checks again at once: an engine that was down at the last round (one still
  starting when the gateway did, say) may be up now; that round is shared by the requests
  that ask while it runs and reused for ``REFRESH_MIN_S``. A breaker opens after
  ``breaker_failures`` consecutive request failures (see :mod:`~sloserve.serve.breaker`).
- **Tokens.** One token per streamed chunk that carries text; the upstream's final
  ``usage.completion_tokens`` corrects the count on the last chunk when it is larger.
- **Priority.** Forwarded in the body only with ``forward_priority`` (vLLM rejects a
  non-zero priority unless started with ``--scheduling-policy priority``). sloserve's own
  fields (``slo``, ``qoe``, ``request_class``) are removed unless ``forward_slo`` (for
  sloserve upstreams, whose per-instance policies use them).

The backend is split by concept: :mod:`~sloserve.serve.upstream_config` (the options),
:mod:`~sloserve.serve.upstream_queue` (per-upstream state, estimates, admission, queue and
slots), :mod:`~sloserve.serve.upstream_wire` (the forwarded body's fields and the parsing
of streamed chunks) and this module (lifecycle, sending and streaming, retries, health).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from sloserve.serve.backend import (
    Backend,
    FinishReason,
    GenerationRequest,
    ReplicaState,
    ServeError,
    TokenChunk,
)
from sloserve.serve.breaker import BreakerState, CircuitBreaker
from sloserve.serve.scrape import EngineLoad, parse_engine_load
from sloserve.serve.upstream_config import UpstreamConfig
from sloserve.serve.upstream_queue import GatewayQueue, _ewma, _Upstream, _Waiter
from sloserve.serve.upstream_wire import (
    SLOSERVE_BODY_FIELDS,
    _count,
    _parse_event,
    _UpstreamFailed,
    sloserve_fields,
)

if TYPE_CHECKING:
    import httpx

    from sloserve.cluster.routing import Router
    from sloserve.costmodel.base import CostModel

logger = logging.getLogger(__name__)
REFRESH_MIN_S = 0.2
"""An on-demand health round younger than this is reused rather than run again."""


class OpenAIUpstreamBackend(GatewayQueue, Backend):
    """Proxies to OpenAI-compatible engines (see the module docstring for the policies)."""

    name = "openai"
    forwards_unknown_params = True
    """A proxy: engine-specific parameters (vLLM's ``top_k``…) reach the engine, which
    accepts or rejects them."""

    def __init__(self, config: UpstreamConfig, router: Router | None = None) -> None:
        self.config = config
        from sloserve.cluster.routing import make_router

        self.router = router or make_router(config.router, config.router_params, seed=config.seed)
        self._ups = [
            _Upstream(
                url,
                CircuitBreaker(config.breaker_failures, config.breaker_open_s),
            )
            for url in config.upstreams
        ]
        self._cost: CostModel | None = None
        if config.profile is not None:
            from sloserve.costmodel.profile import load_profile

            self._cost = load_profile(config.profile).cost_model()
        self._queue: list[_Waiter] = []
        self._seq = itertools.count()
        self._client: httpx.AsyncClient | None = None
        self._health_client: httpx.AsyncClient | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._refresh: asyncio.Future[None] | None = None
        """The on-demand health round in progress or last run (see ``_refresh_health``)."""
        self._refreshed_at = 0.0
        self._stopping = False
        self._closed = False
        """The HTTP clients are closed (after the drain): nothing more can be sent."""
        self._idle = asyncio.Event()
        self.rejected: dict[str, int] = {}
        """Requests refused by reason (``queue_full``, ``deadline``, ``no_backend``…)."""
        self.holds: dict[str, int] = {}
        """Router holds by reason (the request stayed in the queue)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        import httpx

        c = self.config
        slots = c.max_concurrency * len(self._ups)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(
                connect=c.connect_timeout_s,
                read=c.read_timeout_s,
                write=c.connect_timeout_s,
                pool=c.connect_timeout_s,
            ),
            limits=httpx.Limits(max_connections=slots, max_keepalive_connections=slots),
        )
        self._health_client = httpx.AsyncClient(timeout=c.health_timeout_s)
        if c.health_interval_s > 0:
            await self.check_health()
            self._health_task = asyncio.create_task(self._health_loop())

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        self._stopping = True
        for w in self._queue:
            if not w.fut.done():
                w.fut.set_exception(
                    ServeError("the gateway is shutting down", status=503, reason="shutdown")
                )
        self._queue.clear()
        if self.in_flight:
            self._idle.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        # Closing the client breaks the streams still open: they end with an error (and a
        # retry of one that broke before its first token is refused, not sent).
        self._closed = True
        for client in (self._client, self._health_client):
            if client is not None:
                await client.aclose()

    # ------------------------------------------------------------------ state

    def breaker_states(self) -> dict[str, BreakerState]:
        """Each upstream's circuit-breaker state, by URL."""
        return {u.url: u.breaker.state for u in self._ups}

    def breakers(self) -> dict[str, CircuitBreaker]:
        """Each upstream's circuit breaker, by URL (read-only use: metrics, tests)."""
        return {u.url: u.breaker for u in self._ups}

    def replicas(self) -> Sequence[ReplicaState]:
        return [self._state(u) for u in self._ups]

    def models(self) -> Sequence[str]:
        if self.config.models:
            return self.config.models
        seen: dict[str, None] = {}
        for u in self._ups:
            seen.update(dict.fromkeys(u.models))
        return list(seen)

    # ------------------------------------------------------------------ generation

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        if not self._any_healthy(req):
            await self._refresh_health()
        self._admit(req)
        avoid: frozenset[int] = frozenset()
        attempts = 0
        while True:
            i = await self._acquire(req, avoid)
            started = False
            ok: bool | None = None
            prefilled = False
            released = False
            try:
                # aclosing: a caller that stops reading closes the upstream stream now,
                # not whenever the inner generator is garbage-collected.
                async with contextlib.aclosing(self._stream(i, req)) as stream:
                    async for chunk in stream:
                        if not prefilled:
                            prefilled = True
                            self._ups[i].queued_prompt_tokens -= req.prompt_tokens
                        started = True
                        if chunk.finish_reason is not None:
                            # Settle before the last yield: callers stop reading at the
                            # finish chunk and may close this generator much later.
                            released = True
                            self._release(i, req, True)
                        yield chunk
                return
            except _UpstreamFailed as e:
                ok = False
                if started:
                    raise ServeError(
                        f"upstream {self._ups[i].url} failed mid-stream: {e}",
                        status=502,
                        reason="upstream_error",
                    ) from None
                attempts += 1
                if attempts > self.config.retries:
                    raise self._reject(
                        f"upstream failed after {attempts} attempt(s): {e}",
                        502,
                        "upstream_error",
                        None,
                    ) from None
                avoid = avoid | {i}
            finally:
                if not prefilled:
                    self._ups[i].queued_prompt_tokens -= req.prompt_tokens
                if not released:
                    self._release(i, req, ok)

    def _body(self, req: GenerationRequest) -> dict[str, Any]:
        body = {k: v for k, v in req.body.items() if k not in SLOSERVE_BODY_FIELDS}
        body.setdefault("model", req.model)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = req.max_tokens
        if self.config.forward_priority:
            body["priority"] = req.priority
        if self.config.forward_slo:
            body.update(sloserve_fields(req))
        return body

    async def _stream(self, i: int, req: GenerationRequest) -> AsyncGenerator[TokenChunk, None]:
        """One attempt at upstream ``i``. Raises _UpstreamFailed (upstream's fault) or
        ServeError (the request's fault, as the upstream judged it)."""
        import httpx

        assert self._client is not None, "start() the backend before generating"
        if self._closed:
            raise ServeError("the gateway is shutting down", status=503, reason="shutdown")
        u = self._ups[i]
        path = "/v1/completions" if req.endpoint == "completions" else "/v1/chat/completions"
        sent = time.monotonic()
        counted = 0
        finish: FinishReason | None = None
        usage: dict[str, Any] | None = None
        try:
            async with self._client.stream("POST", u.url + path, json=self._body(req)) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")[:300]
                    if resp.status_code >= 500 or resp.status_code in (408, 429):
                        raise _UpstreamFailed(f"HTTP {resp.status_code}: {detail}")
                    raise ServeError(
                        f"upstream rejected the request: {detail}",
                        status=resp.status_code,
                        reason="upstream_rejected",
                    )
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    text, fin, use = _parse_event(data)
                    if fin is not None:
                        finish = fin
                    if use is not None:
                        usage = use
                    if text:
                        if counted == 0:
                            ttft = time.monotonic() - sent
                            u.ttft_ewma = _ewma(u.ttft_ewma, ttft)
                            u.ttft_min = ttft if u.ttft_min is None else min(u.ttft_min, ttft)
                        counted += 1
                        yield TokenChunk(text, 1)
        except httpx.HTTPError as e:
            raise _UpstreamFailed(f"{type(e).__name__}: {e}") from e
        if finish is None:
            raise _UpstreamFailed("the stream ended without a finish reason")
        total = _count(usage, "completion_tokens")
        total = counted if total is None else total
        prompt = _count(usage, "prompt_tokens")
        u.duration_ewma = _ewma(u.duration_ewma, time.monotonic() - sent)
        u.served += 1
        yield TokenChunk(
            "",
            max(0, total - counted),
            finish,
            prompt_tokens=prompt,
        )

    # ------------------------------------------------------------------ health

    async def check_health(self) -> None:
        """One round of health checks and scrapes of every upstream, concurrently."""
        await asyncio.gather(*(self._check(u) for u in self._ups))
        self._pump()

    async def _check(self, u: _Upstream) -> None:
        import httpx

        client = self._health_client
        assert client is not None
        try:
            r = await client.get(u.url + "/health")
            u.health_timeouts = 0
            u.health_ok = r.status_code < 400
        except httpx.TimeoutException:
            # A live engine busy streaming on a loaded host can miss one deadline; only
            # ``health_timeouts`` in a row mark it down (a dead one refuses at once, below).
            u.health_timeouts += 1
            if u.health_timeouts >= self.config.health_timeouts:
                u.health_ok = False
            return
        except httpx.HTTPError:
            u.health_ok = False
        if not u.health_ok:
            u.load = EngineLoad()
            return
        # Whatever an engine's /metrics or /v1/models holds, a scrape must not raise: it
        # would end the health loop, and upstreams would never be checked again.
        with contextlib.suppress(Exception):
            r = await client.get(u.url + "/metrics")
            if r.status_code == 200:
                u.load = parse_engine_load(r.text)
        if not u.models:
            with contextlib.suppress(Exception):
                r = await client.get(u.url + "/v1/models")
                if r.status_code == 200:
                    u.models = tuple(str(m["id"]) for m in r.json()["data"])

    async def _refresh_health(self) -> None:
        # One round at a time, shared by every request that asks while it runs; a round
        # that ended less than REFRESH_MIN_S ago is fresh enough (a burst of refusals must
        # not become a burst of checks).
        if self.config.health_interval_s <= 0 or self._health_client is None or self._closed:
            return
        if self._refresh is None or (
            self._refresh.done() and time.monotonic() - self._refreshed_at > REFRESH_MIN_S
        ):
            self._refresh = asyncio.ensure_future(self._refresh_round())
        await asyncio.shield(self._refresh)

    async def _refresh_round(self) -> None:
        with contextlib.suppress(Exception):
            await self.check_health()
        self._refreshed_at = time.monotonic()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                await self.check_health()
            except Exception:  # never let one bad round end the checks for good
                logger.exception("health check round failed")
