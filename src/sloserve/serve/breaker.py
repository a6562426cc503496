"""A per-upstream circuit breaker: closed → open → half-open → closed.

``closed``: requests flow; ``failure_threshold`` consecutive failures open it. ``open``: the
upstream gets no requests for ``open_s`` seconds (the router sees it as unhealthy, so
traffic goes elsewhere instead of timing out against a dead server). ``half-open``: after
the cool-down, up to ``half_open_probes`` requests are let through as probes; one success
closes the breaker, one failure re-opens it for another ``open_s``.

Choices: failures are counted consecutively, not as a rate over a window (with a handful of
upstreams and bursty failures a dead server is detected after ``failure_threshold``
requests either way, and a consecutive count needs no window parameter); a passing health
check does not close an open breaker on its own — only a real request can, since ``/health``
may answer while generation is broken.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerPermit:
    """What :meth:`CircuitBreaker.acquire` gave one request."""

    probe_period: int | None
    """The half-open period this request probes in; ``None``: sent while closed."""


class CircuitBreaker:
    """Counts an upstream's consecutive failures and gates requests to it.

    Callers :meth:`acquire` a permit before sending (which reserves a probe slot in
    half-open) and report the outcome with :meth:`record_success` or
    :meth:`record_failure`; a request that ends without an outcome about the upstream (e.g.
    the client went away) passes its permit to :meth:`release`, which gives the probe slot
    back only if that permit *is* a probe of the current half-open period (a request sent
    while the breaker was closed, ending in half-open, must not let a second probe in).
    """

    def __init__(
        self,
        failure_threshold: int = 3,
        open_s: float = 5.0,
        half_open_probes: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if not open_s >= 0:
            raise ValueError("open_s must be >= 0")
        if half_open_probes < 1:
            raise ValueError("half_open_probes must be >= 1")
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.half_open_probes = half_open_probes
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probes = 0
        self._period = 0
        """Counts half-open periods: a probe permit is valid only in the one it was taken."""
        self.times_opened = 0
        """How often the breaker has opened (for metrics and tests)."""

    @property
    def state(self) -> BreakerState:
        """The current state; an open breaker whose cool-down has passed reads half-open."""
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.open_s:
            self._state = BreakerState.HALF_OPEN
            self._probes = 0
            self._period += 1
        return self._state

    def available(self) -> bool:
        """Whether :meth:`allow` would let a request through now (reserves nothing)."""
        s = self.state
        if s is BreakerState.CLOSED:
            return True
        return s is BreakerState.HALF_OPEN and self._probes < self.half_open_probes

    def acquire(self) -> BreakerPermit | None:
        """Let one request through (reserving a probe slot when half-open): its permit, to
        hand to :meth:`release` if it ends without a verdict; ``None``: refused."""
        if not self.available():
            return None
        if self._state is BreakerState.HALF_OPEN:
            self._probes += 1
            return BreakerPermit(self._period)
        return BreakerPermit(None)

    def allow(self) -> bool:
        """:meth:`acquire` for callers that never :meth:`release` (tests, simple clients)."""
        return self.acquire() is not None

    def record_success(self) -> None:
        """The upstream served a request (or its first byte): close, forget failures."""
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._probes = 0

    def record_failure(self) -> None:
        """The upstream failed a request: count it; open at the threshold or in half-open."""
        s = self.state
        self._failures += 1
        if s is BreakerState.HALF_OPEN or (
            s is BreakerState.CLOSED and self._failures >= self.failure_threshold
        ):
            self._trip()

    def release(self, permit: BreakerPermit) -> None:
        """A request ended without telling anything about the upstream: free its probe slot
        (only a probe of the current half-open period holds one)."""
        if (
            permit.probe_period is not None
            and permit.probe_period == self._period
            and self._state is BreakerState.HALF_OPEN
            and self._probes > 0
        ):
            self._probes -= 1

    def _trip(self) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._probes = 0
        self.times_opened += 1

    def retry_after_s(self) -> float:
        """Seconds until an open breaker lets a probe through (0 when not open)."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self.open_s - (self._clock() - self._opened_at))
