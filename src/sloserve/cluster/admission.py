"""Admission: the stage before routing that admits a request or rejects it with a reason.

A rejected request ends at once in state ``REJECTED`` with ``reject_reason`` set (counted
in the summary's ``rejected_by_reason``); nothing is dropped silently. The same objects
serve the simulated cluster and, later, the gateway: they see only the request and an
:class:`AdmissionContext` (the time, the requests the cluster holds, its global queue).

Policies (``cluster.admission: {kind: ..., ...}``):

- ``always``: admit everything (the default).
- ``token-bucket``: ``rate`` tokens per second, at most ``burst`` saved; each request takes
  one; none left: rejected (``rate_limited``). The bucket starts full.
- ``shed``: overload is ``live >= max_live``, where ``live`` is what the cluster holds
  (the global queue plus every replica's outstanding requests). Under overload an arrival
  of a *sheddable* class (``sheddable``, ``batch``, ``be``: the Gateway API Inference
  Extension's criticality) is rejected (``shed``); a non-sheddable one is admitted and, to
  make room, the lowest-priority sheddable request still waiting in the global queue (the
  largest ``priority`` value, the latest arrival among equals) is rejected instead
  (``shed_displaced``) if its priority is not better than the arrival's. Critical and
  standard requests are never shed: admission only ever trades sheddable work for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloserve.core.bounds import MAX_COUNT, Rate
from sloserve.core.errors import ConfigError
from sloserve.core.request import Request


class AdmissionContext(Protocol):
    """What admission sees of the cluster."""

    @property
    def now(self) -> float: ...
    @property
    def live(self) -> int:
        """Requests the cluster holds: its global queue plus every replica's."""
        ...

    def queued(self) -> Iterable[Request]:
        """The requests waiting in the global queue (not yet on a replica)."""
        ...


@dataclass(frozen=True, slots=True)
class Verdict:
    """Admit (``reason`` empty) or reject with ``reason``; ``displace``: a queued request
    to reject (reason ``shed_displaced``) to make room for this one."""

    reason: str = ""
    displace: Request | None = None

    @property
    def admitted(self) -> bool:
        return not self.reason


ADMIT = Verdict()


class Admission(Protocol):
    """Extension point: decides each arrival before the router sees it."""

    name: str

    def admit(self, req: Request, ctx: AdmissionContext) -> Verdict: ...


class AlwaysAdmit:
    name = "always"

    def admit(self, req: Request, ctx: AdmissionContext) -> Verdict:
        return ADMIT


class TokenBucket:
    """``rate`` requests per second on average, bursts of up to ``burst``."""

    name = "token-bucket"

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._t = 0.0

    def admit(self, req: Request, ctx: AdmissionContext) -> Verdict:
        now = ctx.now
        self._tokens = min(self.burst, self._tokens + (now - self._t) * self.rate)
        self._t = now
        if self._tokens >= 1.0 - 1e-12:
            self._tokens -= 1.0
            return ADMIT
        return Verdict("rate_limited")


class Shed:
    """Shed sheddable requests, lowest priority first, once ``live >= max_live``."""

    name = "shed"

    def __init__(self, max_live: int) -> None:
        self.max_live = max_live

    def admit(self, req: Request, ctx: AdmissionContext) -> Verdict:
        if ctx.live < self.max_live:
            return ADMIT
        if req.req_class.sheddable:
            return Verdict("shed")
        worst: Request | None = None
        for q in ctx.queued():
            if not q.req_class.sheddable or q.priority < req.priority:
                continue
            if worst is None or (q.priority, q.arrival, q.req_id) > (
                worst.priority,
                worst.arrival,
                worst.req_id,
            ):
                worst = q
        return Verdict("", worst)


class AdmissionConfig(BaseModel):
    """``cluster.admission``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["always", "token-bucket", "shed"] = "always"
    rate: Rate | None = Field(default=None, description="token-bucket: requests/s")
    burst: float | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        allow_inf_nan=False,
        description="token-bucket: bucket size",
    )
    max_live: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="shed: requests the cluster may hold before shedding",
    )

    @model_validator(mode="after")
    def _params(self) -> AdmissionConfig:
        need = {"always": (), "token-bucket": ("rate", "burst"), "shed": ("max_live",)}[self.kind]
        for k in ("rate", "burst", "max_live"):
            if k in need and getattr(self, k) is None:
                raise ValueError(f"admission {self.kind!r} needs {k}")
            if k not in need and getattr(self, k) is not None:
                raise ValueError(f"admission {self.kind!r} takes no {k}")
        return self

    def build(self) -> Admission:
        """A fresh admission object (they keep state: the bucket)."""
        if self.kind == "token-bucket":
            assert self.rate is not None and self.burst is not None
            return TokenBucket(self.rate, self.burst)
        if self.kind == "shed":
            assert self.max_live is not None
            return Shed(self.max_live)
        if self.kind == "always":
            return AlwaysAdmit()
        raise ConfigError(f"unknown admission {self.kind!r}")  # pragma: no cover
