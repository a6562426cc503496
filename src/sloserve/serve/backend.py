"""The contract between the HTTP layer of the gateway and what generates tokens.

The HTTP layer (``serve/api.py``) parses and validates an OpenAI request, turns it into a
:class:`GenerationRequest` and asks a :class:`Backend` for a stream of :class:`TokenChunk`.
Two backends implement it: ``emulated`` (replicas of the simulation engine stepped in wall
time) and ``openai`` (a proxy to real OpenAI-compatible engines). Both spread requests over
their replicas with a router of the cluster layer (:mod:`sloserve.cluster.routing`: the
very objects the simulated cluster uses) and report each replica as a
:class:`ReplicaState`, which is what ``/metrics`` exports (and what the ``openai``
backend's router views are built from, :mod:`sloserve.serve.replica_view`).

Loads no web framework: importing this module is cheap and safe in simulation code.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sloserve.core.errors import SloserveError
from sloserve.core.request import SLO, QoESpec, RequestClass

Endpoint = Literal["completions", "chat.completions"]
FinishReason = Literal["stop", "length", "abort"]


@dataclass(slots=True)
class GenerationRequest:
    """One accepted request, as the backends see it (the API layer fills every field)."""

    request_id: str
    """The id the response carries (``cmpl-…`` / ``chatcmpl-…``)."""
    endpoint: Endpoint
    model: str
    prompt_tokens: int
    """Prompt length in tokens as the gateway counts it (the emulated backend's prompt)."""
    max_tokens: int
    """Upper bound on generated tokens (the request's ``max_tokens`` or the default)."""
    arrival: float
    """``time.monotonic()`` when the gateway accepted it."""
    priority: int = 0
    """Lower is served first (vLLM's convention)."""
    sheddable: bool = False
    """Dropped first under overload (429 ``shed``): a named objective of priority below
    zero (the Gateway API Inference Extension's sheddable requests)."""
    fairness_id: str | None = None
    """The tenant (``x-gateway-inference-fairness-id``): the ``openai`` backend's gateway
    queue serves tenants round-robin."""
    slo: SLO = field(default_factory=SLO)
    qoe: QoESpec | None = None
    request_class: RequestClass = RequestClass.RT
    output_tokens: int | None = None
    """The emulated backend's output length when the gateway chose one (a configured
    distribution); ``None`` generates ``max_tokens``. Upstream engines decide themselves."""
    body: dict[str, Any] = field(default_factory=dict)
    """The validated OpenAI body, for backends that forward it (the ``openai`` backend)."""

    @property
    def deadline(self) -> float | None:
        """Absolute monotonic time of the end-to-end deadline, if the request has one."""
        return None if self.slo.deadline_s is None else self.arrival + self.slo.deadline_s


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """A piece of the generated stream: ``num_tokens`` >= 0 tokens of ``text``.

    The last chunk of a stream has ``finish_reason`` set; it may carry text too.
    """

    text: str
    num_tokens: int
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    """On the last chunk: the prompt length the engine reports (usage), if it does."""


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """What a router and ``/metrics`` know of one replica (engine or upstream)."""

    name: str
    """Stable and bounded: ``replica-0`` or the upstream's URL (a metric label)."""
    healthy: bool
    running: int
    waiting: int
    kv_usage: float
    """Fraction of KV cache in use, 0..1 (``nan`` when the engine does not say)."""
    in_flight: int = 0
    """Requests the gateway has sent there and not yet seen end."""
    queued_prompt_tokens: int = 0
    """Prompt tokens admitted there and not yet prefilled (as far as the gateway knows)."""
    predicted_ttft_s: float | None = None
    """The backend's estimate of a new request's TTFT there now, if it can make one."""


class ServeError(SloserveError):
    """A request the gateway will not (or can no longer) serve; becomes an HTTP error.

    Raised by :meth:`Backend.generate` before its first chunk (the API answers with
    ``status`` and the reason in ``x-sloserve-drop-reason``) or while streaming (the API
    ends the stream with an explicit error event).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 503,
        reason: str = "backend_error",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        """Short machine-readable cause: ``queue_full``, ``deadline``, ``no_backend``…"""
        self.retry_after_s = retry_after_s


class Backend(abc.ABC):
    """Generates tokens for accepted requests. One instance serves the whole process.

    Contract: every request passed to :meth:`generate` ends exactly once: its iterator
    yields a chunk with ``finish_reason``, or raises :class:`ServeError`, or is closed by
    the caller (client disconnect), in which case the backend cancels the request and frees
    what it held (KV cache, a concurrency slot, the upstream connection).
    """

    name: str = "backend"

    @abc.abstractmethod
    async def start(self) -> None:
        """Start background tasks (engine loops, health checks). Called once, in the loop."""

    @abc.abstractmethod
    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Stop accepting, let in-flight streams finish (up to the timeout), then end the
        rest with an error."""

    @abc.abstractmethod
    def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        """Stream the tokens of ``req``; admission errors are raised before the first chunk."""

    @abc.abstractmethod
    def replicas(self) -> Sequence[ReplicaState]:
        """The current state of every replica, in a stable order."""

    def models(self) -> Sequence[str]:
        """The model names this backend serves (``GET /v1/models``)."""
        return ()

    @property
    def queue_size(self) -> int:
        """Requests waiting in the backend's *own* queue in front of its replicas (a
        gateway queue); 0 by default. ``sloserve_queue_size`` adds the replicas'
        ``waiting`` to it, so a backend reports only what its replicas do not."""
        return 0

    forwards_unknown_params: bool = False
    """Whether unknown body fields reach the engine (lenient mode): ``True`` keeps them
    in :attr:`GenerationRequest.body` and names them in ``x-sloserve-forwarded-params``;
    ``False`` strips them and names them in ``x-sloserve-ignored-params``."""

    def max_context(self) -> int | None:
        """The served model's context length in tokens, if the backend knows it: the API
        answers 400 when prompt + ``max_tokens`` exceeds it, before admission."""
        return None

    def check_params(self, body: dict[str, Any]) -> list[str]:
        """Names of parameters in the validated OpenAI ``body`` this backend cannot honour
        (the API answers 400 naming them); none by default."""
        return []

    @property
    def healthy(self) -> bool:
        """At least one replica can take requests (``GET /health``)."""
        return any(r.healthy for r in self.replicas())
