"""The ``openai`` backend: a gateway in front of OpenAI-compatible engines (vLLM, SGLang…).

The gateway owns what an engine cannot see across replicas: it **queues** requests and
orders them (``fcfs``, ``priority``, ``edf``), **limits concurrency** per upstream (so the
engines' own queues stay short and the gateway's ordering decides), **routes** with a
:mod:`~sloserve.serve.routing` router, **admits** or rejects, **retries** failed sends, trips
a per-upstream **circuit breaker** and **health-checks**. Each request is forwarded as a
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
- **Health.** Every ``health_interval_s`` the gateway GETs ``/health`` (one failure marks
  the upstream unhealthy, one success healthy again: a killed engine stops getting traffic
  within one interval), ``/metrics`` (engine load, see :mod:`~sloserve.serve.scrape`) and,
  until it knows them, ``/v1/models``. A breaker opens after ``breaker_failures``
  consecutive request failures (see :mod:`~sloserve.serve.breaker`).
- **Tokens.** One token per streamed chunk that carries text; the upstream's final
  ``usage.completion_tokens`` corrects the count on the last chunk when it is larger.
- **Priority.** Forwarded in the body only with ``forward_priority`` (vLLM rejects a
  non-zero priority unless started with ``--scheduling-policy priority``). sloserve's own
  fields (``slo``, ``qoe``, ``request_class``) are removed unless ``forward_slo`` (for
  sloserve upstreams, whose per-instance policies use them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sloserve.core.errors import ConfigError
from sloserve.core.request import RequestClass
from sloserve.serve.backend import (
    Backend,
    FinishReason,
    GenerationRequest,
    ReplicaState,
    Router,
    ServeError,
    TokenChunk,
)
from sloserve.serve.breaker import BreakerPermit, BreakerState, CircuitBreaker
from sloserve.serve.routing import make_router, router_names
from sloserve.serve.scrape import EngineLoad, parse_engine_load

if TYPE_CHECKING:
    import httpx

    from sloserve.costmodel.base import CostModel

logger = logging.getLogger(__name__)

QueueOrder = Literal["fcfs", "priority", "edf"]
Admission = Literal["none", "queue", "slo"]

SLOSERVE_BODY_FIELDS = ("slo", "qoe", "request_class", "priority")
"""Body fields that are sloserve's extensions: never forwarded as such to an engine."""

EWMA_ALPHA = 0.2
"""Weight of a new observation in the moving averages of TTFT and request duration."""

ASSUMED_DECODE_CONTEXT = 512
"""KV tokens each running request reads per decode step, for the cost model's decode time
(the gateway does not see the engines' contexts; ShareGPT-like requests are around it)."""


class UpstreamConfig(BaseModel):
    """How the ``openai`` backend proxies, queues, routes and protects its upstreams."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    upstreams: tuple[str, ...] = Field(min_length=1)
    """Base URLs of OpenAI-compatible engines (``http://host:port``, without ``/v1``)."""
    router: str = "least-loaded"
    """Router name (:func:`~sloserve.serve.routing.router_names`)."""
    seed: int = 0
    """Seed of randomised routers (``power-of-two``)."""
    order: QueueOrder = "fcfs"
    """Gateway queue order: ``fcfs``, ``priority`` (lower first) or ``edf`` (least slack)."""
    admission: Admission = "queue"
    """``none`` (never reject for load), ``queue`` (429 when full), ``slo`` (also 429 when
    a real-time request's TTFT target or deadline can no longer be met)."""
    max_queue: int = Field(default=1024, ge=0)
    """Requests that may wait in the gateway queue (``queue``/``slo`` admission)."""
    max_concurrency: int = Field(default=64, ge=1)
    """Requests in flight per upstream; more wait in the gateway's queue."""
    queue_timeout_s: float = Field(default=60.0, gt=0)
    """Longest wait in the gateway queue before the request gets 503 ``queue_timeout``."""
    connect_timeout_s: float = Field(default=2.0, gt=0)
    """Seconds to open a connection to an upstream (a failure is retried)."""
    read_timeout_s: float = Field(default=60.0, gt=0)
    """Longest silence between two pieces of an upstream's response."""
    retries: int = Field(default=2, ge=0)
    """Extra attempts for a request that failed before its first token."""
    breaker_failures: int = Field(default=3, ge=1)
    """Consecutive failures that open an upstream's circuit breaker."""
    breaker_open_s: float = Field(default=5.0, ge=0)
    """Seconds an open breaker keeps the upstream out before a probe request."""
    health_interval_s: float = Field(default=2.0, ge=0)
    """Seconds between health checks and metric scrapes (0 disables them)."""
    health_timeout_s: float = Field(default=1.0, gt=0)
    """Timeout of one health check or scrape."""
    forward_priority: bool = False
    """Send the request's ``priority`` to the engine (vLLM's priority scheduling)."""
    forward_slo: bool = False
    """Send the request's ``request_class``, ``slo`` and ``qoe`` to the engine as sloserve's
    body fields: for upstreams that are sloserve servers themselves (their policies, e.g.
    Andes, use them); other engines may reject the unknown fields."""
    profile: str | None = None
    """Replica profile (``sloserve profiles``) whose cost model estimates TTFT and TPOT
    for EDF slack, SLO admission and the ``slo-aware`` router; ``None``: observed TTFTs."""
    models: tuple[str, ...] = ()
    """Model names for ``/v1/models``; empty: the union of what the upstreams list."""

    @field_validator("upstreams")
    @classmethod
    def _urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for url in v:
            u = url.strip().rstrip("/")
            if u.endswith("/v1"):
                u = u[: -len("/v1")]
            if not u.startswith(("http://", "https://")) or len(u.split("://", 1)[1]) == 0:
                raise ValueError(f"upstream {url!r} is not an http(s):// URL")
            out.append(u)
        if len(set(out)) != len(out):
            raise ValueError(f"duplicate upstreams in {list(v)}")
        return tuple(out)

    @field_validator("router")
    @classmethod
    def _router(cls, v: str) -> str:
        if v not in router_names():
            raise ValueError(f"unknown router {v!r}; choose one of: {', '.join(router_names())}")
        return v

    @model_validator(mode="after")
    def _profile_exists(self) -> UpstreamConfig:
        if self.profile is not None:
            from sloserve.costmodel.profile import load_profile

            load_profile(self.profile)  # fail at configuration time, not on a request
        return self

    @classmethod
    def build(cls, **kwargs: Any) -> UpstreamConfig:
        """Validate, turning pydantic's errors into one-line :class:`ConfigError`."""
        from pydantic import ValidationError

        try:
            return cls(**kwargs)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or "config"
            raise ConfigError(f"upstream config {loc}: {err['msg']}") from None


class _UpstreamFailed(Exception):
    """An upstream failed a request (its fault, not the request's): count it, maybe retry."""


@dataclass(slots=True)
class _Upstream:
    url: str
    breaker: CircuitBreaker
    health_ok: bool = True
    """Optimistic until the first check: a gateway started before its engines still works."""
    in_flight: int = 0
    queued_prompt_tokens: int = 0
    """Prompt tokens sent there whose first token has not come back yet."""
    load: EngineLoad = field(default_factory=EngineLoad)
    models: tuple[str, ...] = ()
    ttft_ewma: float | None = None
    ttft_min: float | None = None
    duration_ewma: float | None = None
    served: int = 0
    failed: int = 0
    permits: dict[int, BreakerPermit] = field(default_factory=dict)
    """The breaker permit of each request in flight here, by ``id(request)``."""

    @property
    def healthy(self) -> bool:
        return self.health_ok and self.breaker.state is not BreakerState.OPEN


@dataclass(order=True, slots=True)
class _Waiter:
    key: tuple[float, ...]
    seq: int
    req: GenerationRequest = field(compare=False)
    fut: asyncio.Future[int] = field(compare=False)
    avoid: frozenset[int] = field(compare=False, default=frozenset())
    """Upstreams that already failed this request: used only when no other is healthy."""


def sloserve_fields(req: GenerationRequest) -> dict[str, Any]:
    """The request's class, SLO and QoE as sloserve's body fields (what the gateway resolved
    from the body, the ``x-slo-*`` headers and the class defaults)."""

    def ms(s: float | None) -> float | None:
        return None if s is None else s * 1e3

    out: dict[str, Any] = {"request_class": req.request_class.value}
    slo = {"ttft_ms": ms(req.slo.ttft_s), "tpot_ms": ms(req.slo.tpot_s)}
    slo["deadline_ms"] = ms(req.slo.deadline_s)
    slo = {k: v for k, v in slo.items() if v is not None}
    if slo:
        out["slo"] = slo
    if req.qoe is not None:
        out["qoe"] = {"ttft_s": req.qoe.ttft_s, "tokens_per_s": req.qoe.tokens_per_s}
    return out


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA_ALPHA) * old + EWMA_ALPHA * new


def _finish(reason: Any) -> FinishReason:
    return "length" if reason == "length" else "abort" if reason == "abort" else "stop"


def _parse_event(data: str) -> tuple[str, FinishReason | None, dict[str, Any] | None]:
    """Text, finish reason and usage of one SSE ``data`` payload of a streamed completion
    or chat completion. Anything that is not such a chunk (an error event, JSON of another
    shape) raises _UpstreamFailed: the upstream's fault, never an unhandled exception."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as e:
        raise _UpstreamFailed(f"bad SSE data {data[:80]!r}") from e
    if not isinstance(obj, dict):
        raise _UpstreamFailed(f"SSE data is not a chunk object: {data[:80]!r}")
    if "error" in obj or obj.get("object") == "error":
        raise _UpstreamFailed(f"error event: {data[:200]}")
    usage = obj.get("usage")
    text = ""
    finish: FinishReason | None = None
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        raise _UpstreamFailed(f"bad choices in {data[:80]!r}")
    for choice in choices:
        if not isinstance(choice, dict):
            raise _UpstreamFailed(f"bad choice in {data[:80]!r}")
        delta = choice.get("delta")
        if delta is not None and not isinstance(delta, dict):
            raise _UpstreamFailed(f"bad delta in {data[:80]!r}")
        piece = delta.get("content") if delta is not None else choice.get("text")
        if piece is not None and not isinstance(piece, str):
            raise _UpstreamFailed(f"non-text content in {data[:80]!r}")
        text += piece or ""
        if choice.get("finish_reason") is not None:
            finish = _finish(choice["finish_reason"])
    # Usage is advisory (it corrects the token count): a malformed one is ignored.
    return text, finish, usage if isinstance(usage, dict) and usage else None


def _count(usage: dict[str, Any] | None, key: str) -> int | None:
    """A non-negative integer count from ``usage``, or None when absent or malformed."""
    v = None if usage is None else usage.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        return None
    return int(v)


class OpenAIUpstreamBackend(Backend):
    """Proxies to OpenAI-compatible engines (see the module docstring for the policies)."""

    name = "openai"
    forwards_unknown_params = True
    """A proxy: engine-specific parameters (vLLM's ``top_k``…) reach the engine, which
    accepts or rejects them."""

    def __init__(self, config: UpstreamConfig, router: Router | None = None) -> None:
        self.config = config
        self.router = router or make_router(config.router, seed=config.seed)
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
        self._stopping = False
        self._closed = False
        """The HTTP clients are closed (after the drain): nothing more can be sent."""
        self._idle = asyncio.Event()
        self.rejected: dict[str, int] = {}
        """Requests refused by reason (``queue_full``, ``deadline``, ``no_backend``…)."""

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

    @property
    def in_flight(self) -> int:
        """Requests sent to an upstream and not yet ended."""
        return sum(u.in_flight for u in self._ups)

    @property
    def queue_size(self) -> int:
        """Requests waiting in the gateway's queue."""
        return sum(1 for w in self._queue if not w.fut.done())

    def breaker_states(self) -> dict[str, BreakerState]:
        """Each upstream's circuit-breaker state, by URL."""
        return {u.url: u.breaker.state for u in self._ups}

    def breakers(self) -> dict[str, CircuitBreaker]:
        """Each upstream's circuit breaker, by URL (read-only use: metrics, tests)."""
        return {u.url: u.breaker for u in self._ups}

    def replicas(self) -> Sequence[ReplicaState]:
        return [self._state(u) for u in self._ups]

    def _state(self, u: _Upstream) -> ReplicaState:
        load = u.load
        return ReplicaState(
            name=u.url,
            healthy=u.healthy,
            running=load.running if load.running is not None else u.in_flight,
            waiting=load.waiting if load.waiting is not None else 0,
            kv_usage=load.kv_usage if load.kv_usage is not None else math.nan,
            in_flight=u.in_flight,
            queued_prompt_tokens=u.queued_prompt_tokens,
            predicted_ttft_s=self._predict_ttft(u, 0) if self._cost is not None else None,
        )

    def models(self) -> Sequence[str]:
        if self.config.models:
            return self.config.models
        seen: dict[str, None] = {}
        for u in self._ups:
            seen.update(dict.fromkeys(u.models))
        return list(seen)

    # ------------------------------------------------------------------ estimates

    def _predict_ttft(self, u: _Upstream, prompt_tokens: int) -> float | None:
        """TTFT of a new request of ``prompt_tokens`` sent to ``u`` now (None: no idea)."""
        if self._cost is None:
            # The moving average describes the load of the last requests; an idle upstream
            # answers as fast as it ever did. (Without this, SLO admission that rejected
            # everything after a burst would never see a new TTFT and never recover.)
            return u.ttft_min if u.in_flight == 0 else u.ttft_ewma
        # Everything sent there and not yet prefilled goes first (FCFS engine); one decode
        # iteration of the running requests interleaves with it.
        t = self._cost.prefill_time(u.queued_prompt_tokens + prompt_tokens)
        running = max(u.in_flight, u.load.running or 0)
        if running:
            t += self._cost.decode_time(running, running * ASSUMED_DECODE_CONTEXT)
        return t

    def _tpot_estimate(self) -> float:
        if self._cost is None:
            return 0.0
        running = max(1, self.in_flight // max(1, len(self._ups)))
        return self._cost.decode_time(running, running * ASSUMED_DECODE_CONTEXT)

    def _service_estimate(self, req: GenerationRequest) -> float:
        """Work needed before ``req``'s deadline: prefill, plus decode for an e2e deadline."""
        if self._cost is None:
            return 0.0
        t = self._cost.prefill_time(req.prompt_tokens)
        if req.deadline is not None:
            t += req.max_tokens * self._tpot_estimate()
        return t

    def _target(self, req: GenerationRequest) -> float | None:
        """Absolute monotonic time by which ``req`` must have its first token (or end)."""
        if req.deadline is not None:
            return req.deadline
        if req.slo.ttft_s is not None:
            return req.arrival + req.slo.ttft_s
        return None

    def _queue_key(self, req: GenerationRequest) -> tuple[float, ...]:
        order = self.config.order
        if order == "priority":
            return (float(req.priority), req.arrival)
        if order == "edf":
            target = self._target(req)
            latest_start = math.inf if target is None else target - self._service_estimate(req)
            return (latest_start, req.arrival)
        return (req.arrival,)

    def _mean_duration(self) -> float:
        seen = [u.duration_ewma for u in self._ups if u.duration_ewma is not None]
        return sum(seen) / len(seen) if seen else 1.0

    def _queue_wait_estimate(self, ahead: int) -> float:
        """Seconds until ``ahead`` queued requests have all been given a slot."""
        slots = self.config.max_concurrency * max(1, sum(u.healthy for u in self._ups))
        cap = self.config.max_concurrency
        free = sum(max(0, cap - u.in_flight) for u in self._ups if u.healthy)
        if ahead < free:
            return 0.0
        return (ahead - free + 1) / slots * self._mean_duration()

    def _ttft_estimate(self, req: GenerationRequest, ahead: int) -> float | None:
        best = [
            t
            for u in self._ups
            if u.healthy and (t := self._predict_ttft(u, req.prompt_tokens)) is not None
        ]
        if not best:
            return None
        return self._queue_wait_estimate(ahead) + min(best)

    # ------------------------------------------------------------------ admission, queue

    def _reject(
        self, message: str, status: int, reason: str, retry_after: float | None
    ) -> ServeError:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return ServeError(message, status=status, reason=reason, retry_after_s=retry_after)

    def _no_backend(self) -> ServeError:
        waits = [u.breaker.retry_after_s() for u in self._ups]
        retry = max(1.0, min(waits), self.config.health_interval_s)
        return self._reject("no healthy upstream", 503, "no_backend", retry)

    def _admit(self, req: GenerationRequest) -> None:
        """Raise the ServeError that refuses ``req`` at arrival, if any."""
        c = self.config
        if self._stopping:
            raise self._reject("the gateway is shutting down", 503, "shutdown", None)
        if not any(self._serves(u, req) for u in self._ups):
            raise self._reject(f"no upstream serves model {req.model!r}", 404, "model", None)
        if not self._any_healthy(req):
            raise self._no_backend()
        waiting = self.queue_size
        has_slot = any(self._available(i) for i in range(len(self._ups)))
        if c.admission != "none" and waiting >= c.max_queue and not has_slot:
            retry = max(1.0, self._queue_wait_estimate(waiting))
            raise self._reject(
                f"gateway queue full ({waiting} waiting)", 429, "queue_full", math.ceil(retry)
            )
        if c.admission == "slo" and req.request_class is RequestClass.RT:
            target = self._target(req)
            # Only the waiters the queue order serves before this request delay it (with
            # ``priority`` or ``edf`` a new urgent request overtakes the queue).
            key = self._queue_key(req)
            ahead = sum(1 for w in self._queue if not w.fut.done() and w.key <= key)
            est = self._ttft_estimate(req, ahead)
            if target is not None and est is not None and req.arrival + est > target:
                raise self._reject(
                    f"estimated TTFT {est * 1e3:.0f} ms misses the request's SLO",
                    429,
                    "deadline",
                    math.ceil(max(1.0, self._queue_wait_estimate(ahead))),
                )

    def _available(self, i: int) -> bool:
        u = self._ups[i]
        return u.health_ok and u.breaker.available() and u.in_flight < self.config.max_concurrency

    def _serves(self, u: _Upstream, req: GenerationRequest) -> bool:
        """Whether ``u`` serves ``req``'s model, as far as its ``/v1/models`` said (upstreams
        that have not said are assumed to serve everything)."""
        return not u.models or req.model in u.models

    def _any_healthy(self, req: GenerationRequest) -> bool:
        return any(u.healthy and self._serves(u, req) for u in self._ups)

    def _pick(self, req: GenerationRequest, avoid: frozenset[int] = frozenset()) -> int | None:
        """An upstream with a free slot for ``req`` by the router, or None."""
        healthy_other = any(
            u.healthy and i not in avoid and self._serves(u, req) for i, u in enumerate(self._ups)
        )
        states = [
            dataclasses.replace(
                self._state(u),
                healthy=self._available(i)
                and self._serves(u, req)
                and not (healthy_other and i in avoid),
                # This request's own prefill counts too (the SLO filter compares with its
                # TTFT target).
                predicted_ttft_s=(
                    self._predict_ttft(u, req.prompt_tokens) if self._cost is not None else None
                ),
            )
            for i, u in enumerate(self._ups)
        ]
        return self.router.pick(req, states)

    def _take(self, i: int, req: GenerationRequest) -> None:
        u = self._ups[i]
        # _pick offers only available upstreams, so the breaker lets it through.
        u.permits[id(req)] = u.breaker.acquire() or BreakerPermit(None)
        u.in_flight += 1
        u.queued_prompt_tokens += req.prompt_tokens
        self._idle.clear()

    def _pump(self) -> None:
        """Give free slots to waiting requests, in queue order.

        Work-conserving: a waiter that no free upstream can take (its model is served only
        by busy ones) does not block those behind it that can use a free slot.
        """
        while self._queue and self._queue[0].fut.done():
            heapq.heappop(self._queue)
        n = len(self._ups)
        if not self._queue or not any(self._available(i) for i in range(n)):
            return
        granted = False
        for w in sorted(self._queue):
            if w.fut.done():
                continue
            if not any(self._available(i) for i in range(n)):
                break
            i = self._pick(w.req, w.avoid)
            if i is None:
                continue
            self._take(i, w.req)
            w.fut.set_result(i)
            granted = True
        if granted:
            self._queue = [w for w in self._queue if not w.fut.done()]
            heapq.heapify(self._queue)

    async def _acquire(self, req: GenerationRequest, avoid: frozenset[int]) -> int:
        """Wait for a slot at some upstream; ServeError when waiting cannot succeed."""
        if self._closed:
            raise self._reject("the gateway is shutting down", 503, "shutdown", None)
        if not self._queue:
            i = self._pick(req, avoid)
            if i is not None:
                self._take(i, req)
                return i
        loop = asyncio.get_running_loop()
        w = _Waiter(self._queue_key(req), next(self._seq), req, loop.create_future(), avoid)
        heapq.heappush(self._queue, w)
        self._pump()
        c = self.config
        target = self._target(req)
        try:
            while not w.fut.done():
                # Wake up now and then even without a release: breakers reopen with time.
                await asyncio.wait({w.fut}, timeout=0.25)
                if w.fut.done():
                    break
                self._pump()
                if w.fut.done():
                    break
                now = time.monotonic()
                if not self._any_healthy(req):
                    w.fut.cancel()
                    raise self._no_backend()
                if now - req.arrival > c.queue_timeout_s:
                    w.fut.cancel()
                    raise self._reject(
                        f"waited {c.queue_timeout_s:g} s in the gateway queue",
                        503,
                        "queue_timeout",
                        None,
                    )
                if c.admission == "slo" and req.request_class is RequestClass.RT and target:
                    est = self._ttft_estimate(req, 0) or 0.0
                    if now + est > target:
                        w.fut.cancel()
                        raise self._reject(
                            "the request's SLO can no longer be met", 429, "deadline", 1.0
                        )
            return w.fut.result()
        except BaseException:
            # Cancelled while queued (client gone) or rejected: give back a slot that the
            # pump may have assigned in the meantime.
            if w.fut.done() and not w.fut.cancelled() and w.fut.exception() is None:
                i = w.fut.result()
                self._ups[i].queued_prompt_tokens -= req.prompt_tokens
                self._release(i, req, None)
            elif not w.fut.done():
                w.fut.cancel()
            raise

    def _release(self, i: int, req: GenerationRequest, ok: bool | None) -> None:
        """End a request's use of upstream ``i``: ``ok`` True/False tells the breaker, None
        (client gone, request's own fault) tells it nothing."""
        u = self._ups[i]
        u.in_flight -= 1
        permit = u.permits.pop(id(req), BreakerPermit(None))
        if ok is True:
            u.breaker.record_success()
        elif ok is False:
            u.breaker.record_failure()
            u.failed += 1
        else:
            u.breaker.release(permit)
        if self.in_flight == 0:
            self._idle.set()
        self._pump()

    # ------------------------------------------------------------------ generation

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
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
            u.health_ok = r.status_code < 400
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

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                await self.check_health()
            except Exception:  # never let one bad round end the checks for good
                logger.exception("health check round failed")
