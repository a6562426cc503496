"""The ``openai`` backend's configuration: :class:`UpstreamConfig`.

Which upstreams, router, queue order, admission, concurrency, timeouts, retries, circuit
breaker, health checks and what is forwarded to the engines. What each choice does is told
in :mod:`sloserve.serve.upstream`'s docstring.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sloserve.cluster.routing import check_router, router_names
from sloserve.core.bounds import MAX_COUNT, Seconds, Seed, Time
from sloserve.core.errors import ConfigError, plain_message

QueueOrder = Literal["fcfs", "priority", "edf"]
Admission = Literal["none", "queue", "slo"]


class UpstreamConfig(BaseModel):
    """How the ``openai`` backend proxies, queues, routes and protects its upstreams."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    upstreams: tuple[str, ...] = Field(min_length=1)
    """Base URLs of OpenAI-compatible engines (``http://host:port``, without ``/v1``)."""
    router: str = "least-loaded"
    """Router name (:func:`~sloserve.cluster.routing.router_names`: the cluster's routers)."""
    router_params: dict[str, Any] = Field(default_factory=dict)
    """The router's parameters (e.g. ``max_outstanding`` of ``least-outstanding``)."""
    seed: Seed = 0
    """Seed of randomised routers (``power-of-two``)."""
    order: QueueOrder = "fcfs"
    """Gateway queue order: ``fcfs``, ``priority`` (lower first) or ``edf`` (least slack)."""
    admission: Admission = "queue"
    """``none`` (never reject for load), ``queue`` (429 when full), ``slo`` (also 429 when
    a real-time request's TTFT target or deadline can no longer be met)."""
    max_queue: int = Field(default=1024, ge=0, le=MAX_COUNT)
    """Requests that may wait in the gateway queue (``queue``/``slo`` admission)."""
    max_concurrency: int = Field(default=64, ge=1, le=MAX_COUNT)
    """Requests in flight per upstream; more wait in the gateway's queue."""
    queue_timeout_s: Seconds = 60.0
    """Longest wait in the gateway queue before the request gets 503 ``queue_timeout``."""
    connect_timeout_s: Seconds = 2.0
    """Seconds to open a connection to an upstream (a failure is retried)."""
    read_timeout_s: Seconds = 60.0
    """Longest silence between two pieces of an upstream's response."""
    retries: int = Field(default=2, ge=0, le=100)
    """Extra attempts for a request that failed before its first token."""
    breaker_failures: int = Field(default=3, ge=1, le=MAX_COUNT)
    """Consecutive failures that open an upstream's circuit breaker."""
    breaker_open_s: Time = 5.0
    """Seconds an open breaker keeps the upstream out before a probe request."""
    health_interval_s: Time = 2.0
    """Seconds between health checks and metric scrapes (0 disables them)."""
    health_timeout_s: Seconds = 1.0
    """Timeout of one health check or scrape."""
    health_timeouts: int = Field(default=3, ge=1, le=MAX_COUNT)
    """Consecutive timed-out health checks that mark an upstream unhealthy. A refused
    connection or an error status marks it at once; a timeout alone is what a busy but
    live engine gives on a loaded host, so one is not taken as death."""
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
    def _router_params(self) -> UpstreamConfig:
        try:
            check_router(self.router, self.router_params)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return self

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
            raise ConfigError(f"upstream config {loc}: {plain_message(err)}") from None
