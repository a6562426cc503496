"""Prometheus metrics of the gateway, one :class:`~prometheus_client.CollectorRegistry` per
app (two gateways in one process, as in the tests, never share counters). Under
``sloserve serve --workers N`` (``PROMETHEUS_MULTIPROC_DIR`` set) ``/metrics`` sums the
counters and histograms of all worker processes; the gauges are the answering process's.

Labels are bounded: ``class`` is ``rt``/``be``; ``status`` is one of :data:`STATUSES`;
``kind`` is ``ttft``/``tpot``/``deadline``; ``replica`` is the backend's stable replica
name. Times are wall-clock seconds as the client sees them (with ``--time-scale`` they are
the simulated times divided by the scale).

* ``sloserve_request_ttft_seconds`` / ``_tpot_seconds`` / ``_duration_seconds``: histograms
  per class, of requests that received at least one token (TPOT: at least two).
* ``sloserve_requests_total{status,class}``: every request the API validated, once, by how
  it ended.
* ``sloserve_client_errors_total{reason}``: requests refused for how they were sent
  (:data:`CLIENT_ERRORS`: slow, oversize, malformed).
* ``sloserve_slo_violations_total{class,kind}``: finished requests that missed a target.
* ``sloserve_prompt_tokens_total{class}`` / ``sloserve_generation_tokens_total{class}``:
  prompt tokens of the requests that received a token (their prefill ran) and tokens
  delivered, counted when the request ends.
* ``sloserve_slo_attainment_total{class,met}``: finished (``ok``) requests with at least one
  target, by whether they met all of them (``met`` is ``true``/``false``); attainment is
  ``met="true"`` over the sum.
* ``sloserve_request_qoe``: Andes' QoE of finished requests that carried a ``qoe`` spec.
* ``sloserve_queue_size``: requests accepted and not yet started: the replicas' waiting
  requests plus the backend's own queue (:attr:`Backend.queue_size`, the ``openai``
  backend's gateway queue);
  ``sloserve_replica_running``, ``_waiting``, ``_kv_usage_ratio`` (a fraction 0..1:
  Prometheus' ``_ratio`` convention), ``_in_flight``, ``_healthy`` per replica (read from
  the backend at scrape time).

Each request that ends is also logged, one line at INFO on the ``sloserve.serve`` logger:
id, model, status, class, prompt and completion tokens, TTFT and e2e in ms, SLO met
(``-`` where it does not apply).
* The emulated backend's replicas also export vLLM's own metrics
  (:mod:`sloserve.serve.vllm_metrics`), so that tools written for vLLM read them.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sloserve.core.request import SLO, QoESpec
from sloserve.metrics.qoe import andes_qoe
from sloserve.serve.backend import Backend

log = logging.getLogger("sloserve.serve")

STATUSES = ("ok", "cancelled", "error", "rejected", "dropped", "unavailable")
"""``ok`` finished; ``cancelled`` the client went away; ``error`` the backend failed after
accepting it; ``rejected`` a 4xx other than 429; ``dropped`` a 429; ``unavailable`` a 503."""

CLIENT_ERRORS = (
    "header_timeout", "read_timeout", "body_too_large", "malformed_json",
    "unsupported_media_type", "malformed_http",
)  # fmt: skip
"""``sloserve_client_errors_total{reason}``: headers or body not received within
``request_read_timeout_s`` (408), a body over ``max_body_bytes`` (413), a body that is not
JSON (400) or not sent as JSON (415), HTTP uvicorn cannot parse (400)."""

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
_TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
)  # fmt: skip
_QOE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


def status_of_http(code: int) -> str:
    """The ``status`` label of a request answered with HTTP ``code`` before streaming."""
    if code == 429:
        return "dropped"
    if code == 503:
        return "unavailable"
    if 400 <= code < 500:
        return "rejected"
    return "error"


@dataclass(slots=True)
class RequestRecord:
    """What the gateway saw of one request: arrival and token delivery times (monotonic).

    Only the first and last delivery times and the count are kept (TTFT, TPOT and
    duration need no more): the full timeline only for a request with a ``qoe`` spec,
    whose QoE needs every token's time. :meth:`tokens` is called once per write."""

    request_class: str
    arrival: float
    slo: SLO = field(default_factory=SLO)
    qoe: QoESpec | None = None
    first: float = math.nan
    last: float = math.nan
    count: int = 0
    token_times: list[float] | None = None
    request_id: str = "-"
    model: str = "-"
    prompt_tokens: int = 0
    """Prompt length as the engine reported it at the end (else as the gateway counted it)."""

    def __post_init__(self) -> None:
        if self.qoe is not None and self.token_times is None:
            self.token_times = []

    def tokens(self, now: float, n: int) -> None:
        """``n`` tokens delivered at ``now``."""
        if n <= 0:
            return
        if not self.count:
            self.first = now
        self.last = now
        self.count += n
        if self.token_times is not None:
            self.token_times.extend([now] * n)


class _ReplicaCollector(Collector):
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = list(self.backend.replicas())
        queue = GaugeMetricFamily("sloserve_queue_size", "Requests accepted, not yet started")
        waiting = sum(s.waiting for s in states)
        queue.add_metric([], float(waiting + self.backend.queue_size))
        yield queue
        families = {
            "running": GaugeMetricFamily(
                "sloserve_replica_running", "Running requests", labels=["replica"]
            ),
            "waiting": GaugeMetricFamily(
                "sloserve_replica_waiting", "Waiting requests", labels=["replica"]
            ),
            "kv_usage": GaugeMetricFamily(
                "sloserve_replica_kv_usage_ratio",
                "KV cache fraction in use (0..1)",
                labels=["replica"],
            ),
            "in_flight": GaugeMetricFamily(
                "sloserve_replica_in_flight", "Requests sent and not ended", labels=["replica"]
            ),
            "healthy": GaugeMetricFamily(
                "sloserve_replica_healthy", "1 when the replica takes requests", labels=["replica"]
            ),
        }
        for s in states:
            families["running"].add_metric([s.name], float(s.running))
            families["waiting"].add_metric([s.name], float(s.waiting))
            families["kv_usage"].add_metric([s.name], float(s.kv_usage))
            families["in_flight"].add_metric([s.name], float(s.in_flight))
            families["healthy"].add_metric([s.name], 1.0 if s.healthy else 0.0)
        yield from families.values()


class GatewayMetrics:
    """The gateway's metrics in their own registry; :meth:`render` is ``/metrics``."""

    def __init__(self, backend: Backend) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.ttft = Histogram(
            "sloserve_request_ttft_seconds", "Time to first token", ["class"],
            buckets=_LATENCY_BUCKETS, registry=reg,
        )  # fmt: skip
        self.tpot = Histogram(
            "sloserve_request_tpot_seconds", "Mean time per output token after the first",
            ["class"], buckets=_TPOT_BUCKETS, registry=reg,
        )  # fmt: skip
        self.duration = Histogram(
            "sloserve_request_duration_seconds", "Arrival to last token", ["class"],
            buckets=_LATENCY_BUCKETS, registry=reg,
        )  # fmt: skip
        self.requests = Counter(
            "sloserve_requests", "Requests by how they ended", ["status", "class"], registry=reg
        )
        self.violations = Counter(
            "sloserve_slo_violations", "Finished requests that missed an SLO target",
            ["class", "kind"], registry=reg,
        )  # fmt: skip
        self.qoe = Histogram(
            "sloserve_request_qoe", "Andes QoE of finished requests with a qoe spec", ["class"],
            buckets=_QOE_BUCKETS, registry=reg,
        )  # fmt: skip
        self.client_errors = Counter(
            "sloserve_client_errors", "Requests refused for how the client sent them",
            ["reason"], registry=reg,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "sloserve_prompt_tokens", "Prompt tokens of requests that received a token",
            ["class"], registry=reg,
        )  # fmt: skip
        self.generation_tokens = Counter(
            "sloserve_generation_tokens", "Tokens delivered to clients", ["class"], registry=reg
        )
        self.attainment = Counter(
            "sloserve_slo_attainment", "Finished requests with an SLO, by whether they met it",
            ["class", "met"], registry=reg,
        )  # fmt: skip
        for cls in ("rt", "be"):  # so that every series exists from the first scrape
            for st in STATUSES:
                self.requests.labels(st, cls)
            self.prompt_tokens.labels(cls)
            self.generation_tokens.labels(cls)
            for met in ("true", "false"):
                self.attainment.labels(cls, met)
        for reason in CLIENT_ERRORS:
            self.client_errors.labels(reason)
        self._replicas = _ReplicaCollector(backend)
        reg.register(self._replicas)
        self._engines: Collector | None = None
        if backend.name in ("emulated", "local"):  # by name: importing them is heavy
            from sloserve.serve.vllm_metrics import VllmEngineCollector

            self._engines = VllmEngineCollector(backend)  # type: ignore[arg-type]
            reg.register(self._engines)
        self._multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        """Set (by ``sloserve serve --workers N``): prometheus-client's multiprocess mode."""

    def render(self) -> bytes:
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        # several gateway processes: counters and histograms summed over all of them (their
        # values live in files), the gauges of this process
        from prometheus_client import multiprocess

        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg, path=self._multiprocess_dir)  # type: ignore[no-untyped-call]
        reg.register(self._replicas)
        if self._engines is not None:
            reg.register(self._engines)
        return generate_latest(reg)

    def client_error(self, reason: str) -> None:
        """A request refused for how it was sent (one of :data:`CLIENT_ERRORS`)."""
        self.client_errors.labels(reason).inc()

    def count(
        self, status: str, request_class: str, request_id: str = "-", model: str = "-"
    ) -> None:
        """A request that ended without streaming (an error before the first token)."""
        self.requests.labels(status, request_class).inc()
        if log.isEnabledFor(logging.INFO):
            log.info(
                "request id=%s model=%s status=%s class=%s prompt_tokens=- "
                "completion_tokens=0 ttft_ms=- e2e_ms=- slo_met=-",
                request_id, model, status, request_class,
            )  # fmt: skip

    def finish(self, rec: RequestRecord, status: str) -> None:
        """A request that was accepted ended with ``status``; record its latencies."""
        cls = rec.request_class
        self.requests.labels(status, cls).inc()
        n = rec.count
        met = self._latencies(rec, status) if n else None
        if n:
            self.prompt_tokens.labels(cls).inc(rec.prompt_tokens)
            self.generation_tokens.labels(cls).inc(n)
        if met is not None:
            self.attainment.labels(cls, "true" if met else "false").inc()
        if log.isEnabledFor(logging.INFO):
            log.info(
                "request id=%s model=%s status=%s class=%s prompt_tokens=%d "
                "completion_tokens=%d ttft_ms=%s e2e_ms=%s slo_met=%s",
                rec.request_id, rec.model, status, cls, rec.prompt_tokens, n,
                _ms(rec.first - rec.arrival) if n else "-",
                _ms(rec.last - rec.arrival) if n else "-",
                "-" if met is None else str(met).lower(),
            )  # fmt: skip

    def _latencies(self, rec: RequestRecord, status: str) -> bool | None:
        """Observe the latencies of a request that received tokens; whether it met its SLO
        (``None``: it did not finish, or had no target)."""
        cls = rec.request_class
        n = rec.count
        ttft = rec.first - rec.arrival
        self.ttft.labels(cls).observe(ttft)
        tpot = (rec.last - rec.first) / (n - 1) if n > 1 else math.nan
        if n > 1:
            self.tpot.labels(cls).observe(tpot)
        duration = rec.last - rec.arrival
        self.duration.labels(cls).observe(duration)
        if status != "ok":
            return None
        slo = rec.slo
        missed = [
            kind
            for kind, target, value in (
                ("ttft", slo.ttft_s, ttft),
                ("tpot", slo.tpot_s if n > 1 else None, tpot),
                ("deadline", slo.deadline_s, duration),
            )
            if target is not None and value > target
        ]
        for kind in missed:
            self.violations.labels(cls, kind).inc()
        if rec.qoe is not None and rec.token_times:
            q = rec.qoe
            self.qoe.labels(cls).observe(
                andes_qoe(rec.arrival, rec.token_times, q.ttft_s, q.tokens_per_s)
            )
        if slo.ttft_s is None and slo.tpot_s is None and slo.deadline_s is None:
            return None
        return not missed


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"
