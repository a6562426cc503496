"""The ``openai`` backend's gateway queue: per-upstream state, estimates, admission, slots.

:class:`_Upstream` is what the gateway knows of one engine (health, breaker, engine load,
requests in flight, observed TTFTs). :class:`GatewayQueue` holds the part of
:class:`~sloserve.serve.upstream.OpenAIUpstreamBackend` that decides *when and where* a
request is sent: the TTFT/queueing estimates, admission at arrival and while queued
(``429``/``503`` with ``Retry-After``), the queue order (``fcfs``, ``priority``, ``edf``)
and the work-conserving hand-out of concurrency slots to the router's pick. The choices are
told in :mod:`sloserve.serve.upstream`'s docstring.

Two conventions of the Gateway API Inference Extension apply in the queue:

* *sheddable* requests (:attr:`GenerationRequest.sheddable`, a named objective of priority
  below zero) are dropped first: with the queue full, a sheddable arrival is refused (429
  ``shed``) and a non-sheddable one takes the place of the least important sheddable waiter,
  which gets the 429 ``shed`` instead;
* tenants (:attr:`GenerationRequest.fairness_id`) share the slots fairly: within a
  priority band (one band unless the order is ``priority``) free slots go round-robin
  between tenants, each tenant's own requests in queue order. Requests without an id form
  one tenant.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sloserve.cluster.routing import Hold, Router
from sloserve.cluster.view import ReplicaStatus, RouteRequest
from sloserve.core.request import RequestClass
from sloserve.serve.backend import (
    GenerationRequest,
    ReplicaState,
    ServeError,
)
from sloserve.serve.breaker import BreakerPermit, BreakerState, CircuitBreaker
from sloserve.serve.replica_view import GatewayReplica, pick
from sloserve.serve.scrape import EngineLoad
from sloserve.serve.upstream_config import UpstreamConfig

if TYPE_CHECKING:
    from sloserve.costmodel.base import CostModel

EWMA_ALPHA = 0.2
"""Weight of a new observation in the moving averages of TTFT and request duration."""

ASSUMED_DECODE_CONTEXT = 512
"""KV tokens each running request reads per decode step, for the cost model's decode time
(the gateway does not see the engines' contexts; ShareGPT-like requests are around it)."""


@dataclass(slots=True)
class _Upstream:
    url: str
    breaker: CircuitBreaker
    health_ok: bool = True
    """Optimistic until the first check: a gateway started before its engines still works."""
    health_timeouts: int = 0
    """Health checks in a row that timed out (reset by any answer or a served stream)."""
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


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA_ALPHA) * old + EWMA_ALPHA * new


class GatewayQueue:
    """Estimates, admission and slot assignment of the ``openai`` backend (a base
    class of it, not used alone: the backend's ``__init__`` sets the attributes below)."""

    config: UpstreamConfig
    router: Router
    rejected: dict[str, int]
    holds: dict[str, int]
    _ups: list[_Upstream]
    _cost: CostModel | None
    _queue: list[_Waiter]
    _seq: itertools.count[int]
    _idle: asyncio.Event
    _stopping: bool
    _closed: bool
    _rr_last: str | None = None
    """The tenant that got the last slot (round-robin resumes after it)."""

    @property
    def in_flight(self) -> int:
        """Requests sent to an upstream and not yet ended."""
        return sum(u.in_flight for u in self._ups)

    @property
    def queue_size(self) -> int:
        """Requests waiting in the gateway's queue."""
        return sum(1 for w in self._queue if not w.fut.done())

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

    async def _refresh_health(self) -> None:
        """Re-check the upstreams now, before a request is refused for want of a healthy
        one (the backend overrides this; here, with no checks to run, nothing changes)."""

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
        victim: _Waiter | None = None
        if c.admission != "none" and waiting >= c.max_queue and not has_slot:
            retry = math.ceil(max(1.0, self._queue_wait_estimate(waiting)))
            if req.sheddable:
                raise self._reject(
                    f"gateway queue full ({waiting} waiting): sheddable request dropped",
                    429, "shed", retry,
                )  # fmt: skip
            victim = self._shed_victim()
            if victim is None:
                raise self._reject(
                    f"gateway queue full ({waiting} waiting)", 429, "queue_full", retry
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
        if victim is not None:  # admitted: it takes the place of a sheddable waiter
            victim.fut.set_exception(
                self._reject(
                    "dropped from the full gateway queue for a more important request",
                    429, "shed", math.ceil(max(1.0, self._queue_wait_estimate(waiting))),
                )
            )  # fmt: skip

    def _shed_victim(self) -> _Waiter | None:
        """The least important sheddable waiter (lowest priority, then the latest)."""
        shed = [w for w in self._queue if w.req.sheddable and not w.fut.done()]
        return max(shed, key=lambda w: (w.req.priority, w.req.arrival, w.seq), default=None)

    def _fair_order(self) -> list[_Waiter]:
        """The waiters in the order free slots go to them: priority bands (with the
        ``priority`` order), round-robin between tenants within a band starting after the
        tenant served last, each tenant's requests in queue order."""
        live = sorted(w for w in self._queue if not w.fut.done())
        if all(w.req.fairness_id is None for w in live):
            return live
        bands: dict[float, dict[str, list[_Waiter]]] = {}
        for w in live:
            band = float(w.req.priority) if self.config.order == "priority" else 0.0
            bands.setdefault(band, {}).setdefault(w.req.fairness_id or "", []).append(w)
        out: list[_Waiter] = []
        for band in sorted(bands):
            tenants = sorted(bands[band])
            last = self._rr_last
            start = next((k for k, t in enumerate(tenants) if last is not None and t > last), 0)
            queues = [bands[band][t] for t in tenants[start:] + tenants[:start]]
            for k in range(max(len(q) for q in queues)):
                out.extend(q[k] for q in queues if k < len(q))
        return out

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
        """An upstream with a free slot for ``req`` by the router, or None (none has one,
        or the router holds the request: either way it waits in the gateway's queue)."""
        healthy_other = any(
            u.healthy and i not in avoid and self._serves(u, req) for i, u in enumerate(self._ups)
        )
        views = [
            GatewayReplica.of(
                i,
                self._state(u),
                model=req.model,
                status=(
                    ReplicaStatus.FAILED
                    if not u.healthy
                    else ReplicaStatus.UP
                    if self._available(i) and not (healthy_other and i in avoid)
                    else ReplicaStatus.BUSY
                ),
                # This request's own prefill counts too (the SLO filter compares with its
                # TTFT target).
                predict=self._predictor(u),
            )
            for i, u in enumerate(self._ups)
            if self._serves(u, req)
        ]
        d = pick(self.router, req, views)
        if isinstance(d, Hold):
            self.holds[d.reason] = self.holds.get(d.reason, 0) + 1
            return None
        return d

    def _predictor(self, u: _Upstream) -> Callable[[RouteRequest], float | None] | None:
        if self._cost is None:
            return None  # the slo-aware router's queue estimate
        return lambda r: self._predict_ttft(u, r.prompt_tokens)

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
        for w in self._fair_order():
            if w.fut.done():
                continue
            if not any(self._available(i) for i in range(n)):
                break
            i = self._pick(w.req, w.avoid)
            if i is None:
                continue
            self._take(i, w.req)
            w.fut.set_result(i)
            self._rr_last = w.req.fairness_id or ""
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
                if not self._any_healthy(req):
                    # Refuse only on a fresh view: an upstream marked down by the last
                    # round (say, one checked before it had started) may be up by now.
                    await self._refresh_health()
                    if w.fut.done():
                        break
                    if not self._any_healthy(req):
                        w.fut.cancel()
                        raise self._no_backend()
                now = time.monotonic()
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
            # A served stream proves the engine alive: it undoes a mark-down that only
            # timed-out health checks made (an explicit unhealthy answer stays).
            if u.health_timeouts:
                u.health_ok = u.health_ok or u.health_timeouts >= self.config.health_timeouts
                u.health_timeouts = 0
        elif ok is False:
            u.breaker.record_failure()
            u.failed += 1
        else:
            u.breaker.release(permit)
        if self.in_flight == 0:
            self._idle.set()
        self._pump()
