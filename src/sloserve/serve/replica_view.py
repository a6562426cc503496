"""The gateway's side of the router contract: its replicas as a cluster ``ClusterView``.

The gateway routes with the very router objects of the simulated cluster
(:mod:`sloserve.cluster.routing`). The ``emulated`` backend runs a
:class:`~sloserve.cluster.cluster.Cluster` in wall time, so its routers read the cluster's
own live replica views. The ``openai`` backend knows its upstreams only by what it observes
and scrapes; :class:`GatewayReplica` turns that into a
:class:`~sloserve.cluster.view.ReplicaView`:

- ``status``: :attr:`~ReplicaStatus.UP` when the upstream takes this request now (health
  check passing, breaker letting it through, a free concurrency slot, not an upstream this
  request already failed on while another is healthy); :attr:`~ReplicaStatus.FAILED` when
  it is unhealthy (health check failing or breaker open); :attr:`~ReplicaStatus.BUSY`
  otherwise (full, a half-open breaker's probe in flight, avoided for a retry).
- ``running`` / ``waiting``: the engine's scraped counts (``running`` falls back to the
  gateway's in-flight count when the engine exports none); ``swapped`` is not scraped (0).
- ``outstanding``: ``max(in_flight, running + waiting + swapped)``. The gateway's count is
  fresh, the engine's lags a scrape but includes other clients' requests: the larger is
  the safer estimate of the load (the ``least-loaded`` and ``power-of-two`` score).
- ``kv_usage``: scraped (``nan`` when the engine exports none: scorers count it as empty).
- ``predicted_ttft_s(req)``: the backend's estimate for this very request (its cost model
  when it has a ``profile``), else None and the ``slo-aware`` router's queue estimate.

:func:`route_request` is what a router knows of a :class:`GenerationRequest` (no output
length). :func:`pick` asks a router and returns the replica index or the :class:`Hold`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sloserve.cluster.prefix_routing import text_block_ids
from sloserve.cluster.routing import Decision, Router
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest
from sloserve.serve.backend import GenerationRequest, ReplicaState

Predictor = Callable[[RouteRequest], float | None]
"""A replica's TTFT estimate (seconds) for a request sent there now; None: no idea."""


@dataclass(frozen=True, slots=True)
class GatewayReplica:
    """A :class:`~sloserve.cluster.view.ReplicaView` of one gateway replica (a snapshot)."""

    replica_id: int
    name: str
    model: str
    status: ReplicaStatus
    running: int
    waiting: int
    kv_usage: float
    in_flight: int = 0
    """Requests the gateway has sent there and not yet seen end."""
    swapped: int = 0
    queued_prompt_tokens: int = 0
    predict: Predictor | None = None
    group: int = 0
    """Upstreams form one group: the gateway has no replica groups."""
    capacity: int = 256
    """Requests it runs at once; unknown for an upstream engine, so vLLM's default
    ``--max-num-seqs`` (only the autoscaler reads it, and the gateway runs none)."""

    @property
    def outstanding(self) -> int:
        return max(self.in_flight, self.running + self.waiting + self.swapped)

    def predicted_ttft_s(self, req: RouteRequest) -> float | None:
        return None if self.predict is None else self.predict(req)

    def cached_prefix_tokens(self, req: RouteRequest) -> int | None:
        return None  # an upstream's cache is invisible: prefix routers keep their own index

    @classmethod
    def of(
        cls,
        replica_id: int,
        state: ReplicaState,
        *,
        model: str,
        status: ReplicaStatus | None = None,
        predict: Predictor | None = None,
    ) -> GatewayReplica:
        """The view of ``state`` (``status`` default: UP if healthy, else FAILED)."""
        if status is None:
            status = ReplicaStatus.UP if state.healthy else ReplicaStatus.FAILED
        if predict is None and state.predicted_ttft_s is not None:
            fixed = state.predicted_ttft_s

            def predict(req: RouteRequest) -> float | None:
                return fixed

        return cls(
            replica_id=replica_id,
            name=state.name,
            model=model,
            status=status,
            running=state.running,
            waiting=state.waiting,
            kv_usage=state.kv_usage,
            in_flight=state.in_flight,
            queued_prompt_tokens=state.queued_prompt_tokens,
            predict=predict,
        )


def route_request(req: GenerationRequest) -> RouteRequest:
    """What a router knows of ``req``."""
    return RouteRequest(
        req_id=req.request_id,
        model=req.model,
        prompt_tokens=req.prompt_tokens,
        arrival=req.arrival,
        slo=req.slo,
        priority=req.priority,
        hash_ids=text_block_ids(prompt_text(req.body)) or None,
    )


def prompt_text(body: dict[str, Any]) -> str:
    """The prompt of an OpenAI body as one string (chat messages' contents joined), for
    the prefix routers' approximate index."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "".join(p for p in prompt if isinstance(p, str))
    parts = []
    for m in body.get("messages") or []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(x.get("text", "") for x in c if isinstance(x, dict))
    return "\n".join(p for p in parts if isinstance(p, str))


def pick(router: Router, req: GenerationRequest, replicas: Sequence[GatewayReplica]) -> Decision:
    """``router``'s decision for ``req`` over ``replicas`` (clock: ``time.monotonic``)."""
    return router.route(route_request(req), ClusterView(replicas, time.monotonic))


def states_view(req: GenerationRequest, states: Sequence[ReplicaState]) -> list[GatewayReplica]:
    """Views of ``states`` (index = replica id) serving ``req``'s model, status from
    ``healthy``: the plain mapping for backends without their own notion of availability."""
    return [GatewayReplica.of(i, s, model=req.model) for i, s in enumerate(states)]
