"""Admission of the emulated backend: what is refused before routing, and why.

Over the replicas that are up and serve the request's model (none: 503 ``no_backend``,
decided by the backend):

* ``max_queue`` caps waiting requests: the queue is full when the cluster's global queue
  already holds ``max_queue`` requests of the model, or every such replica already has
  ``max_queue`` waiting. Then a *sheddable* arrival (a named objective of priority below
  zero, the Gateway API Inference Extension's criticality) is refused with 429 ``shed``;
  any other arrival takes the place of the least important sheddable request of its model
  that has not started (the largest priority value, then the latest arrival), which ends
  with 429 ``shed`` — before its first token, so as a real HTTP status — and leaves the
  cluster at once. With no such request the arrival gets 429 ``queue_full``. Every 429
  carries ``Retry-After: retry_after_s``. This is the openai backend's rule
  (:mod:`~sloserve.serve.upstream_queue`), applied to the cluster's queues.
* With ``admission="slo"`` a real-time request is also refused (429 ``deadline``) when a
  lower bound of its latency misses its target at every such replica: TTFT ≥ the cost
  model's prefill time of the prompt tokens queued there plus its own; end-to-end ≥ that
  plus one decode step per output token at the current batch size and context. A lower
  bound, so a refused request could not have been served in time; best-effort requests
  are never refused for SLOs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.cluster.view import ReplicaView
from sloserve.core.request import RequestStatus
from sloserve.serve.backend import GenerationRequest, ServeError
from sloserve.serve.emulated_config import EmulatedConfig
from sloserve.serve.emulated_stream import _Stream

if TYPE_CHECKING:
    from sloserve.cluster.cluster import Cluster

_NOT_STARTED = RequestStatus.WAITING
"""A request held in the global queue or waiting on a replica, never run (no KV computed)."""


class EmulatedAdmission:
    """The emulated backend's admission stage (a base class of
    :class:`~sloserve.serve.emulated.EmulatedBackend`, not used alone)."""

    config: EmulatedConfig
    scale: float
    _streams: dict[int, _Stream]

    if TYPE_CHECKING:

        @property
        def cluster(self) -> Cluster: ...

    def _refuse(self, message: str, reason: str) -> ServeError:
        return ServeError(
            message, status=429, reason=reason, retry_after_s=self.config.retry_after_s
        )

    def _admit_queue(self, up: Sequence[ReplicaView], req: GenerationRequest) -> _Stream | None:
        """Raise 429 when the queue is full, unless a sheddable waiter can make room for
        ``req``: then return that waiter's stream (shed once ``req`` is admitted)."""
        mq = self.config.max_queue
        if mq is None:
            return None
        held = len(self.cluster.queue.get(req.model, ()))
        if held >= mq:
            full = f"queue full: {held} requests of {req.model!r} held"
        elif all(v.waiting >= mq for v in up):
            least = min(up, key=lambda v: v.waiting)
            full = f"queue full: {least.waiting} requests waiting at {least.name} (the least)"
        else:
            return None
        if req.sheddable:
            raise self._refuse(f"{full}: sheddable request dropped", "shed")
        victim = self._shed_victim(req.model)
        if victim is None:
            raise self._refuse(full, "queue_full")
        return victim

    def _shed_victim(self, model: str) -> _Stream | None:
        """The least important sheddable request of ``model`` that has not started (no
        token sent, still queued): the largest priority value, then the latest arrival."""
        best: _Stream | None = None
        for s in self._streams.values():
            r = s.req
            if not s.sheddable or s.finish or s.sent or r.model != model:
                continue
            if r.status is not _NOT_STARTED or r.num_computed_tokens:
                continue
            if best is None or (r.priority, r.arrival, r.req_id) > (
                best.req.priority, best.req.arrival, best.req.req_id
            ):  # fmt: skip
                best = s
        return best

    def _shed(self, victim: _Stream) -> None:
        """Drop ``victim`` for a more important request: its client gets 429 ``shed``
        (before any token, so a real HTTP status) and it leaves the cluster now."""
        victim.finish = True  # the cluster's abort below must not also report "aborted"
        victim.push(
            self._refuse("dropped from the full queue for a more important request", "shed")
        )
        if self.cluster.abort(victim.req):
            self.cluster.abort_reasons[victim.req.req_id] = "shed"

    def _admit_slo(self, up: Sequence[ReplicaView], req: GenerationRequest, out_len: int) -> None:
        """Raise 429 ``deadline`` when a lower bound of the request's latency misses its
        TTFT target or deadline at every replica (wall seconds, from the gateway's arrival)."""
        slo = req.slo
        if slo.ttft_s is None and slo.deadline_s is None:
            return
        waited = time.monotonic() - req.arrival
        best_ttft = best_e2e = (math.inf, "")
        for v in up:
            inst = self.cluster.replicas[v.replica_id].instance
            assert inst is not None
            cm = inst.cost_model
            queued = sum(r.remaining_compute for r in inst.waiting)
            ttft = cm.prefill_time(queued + req.prompt_tokens) / self.scale
            best_ttft = min(best_ttft, (ttft, v.name))
            if slo.deadline_s is not None:
                batch = len(inst.running) + 1
                ctx = sum(r.num_computed_tokens for r in inst.running) + req.prompt_tokens
                e2e = ttft + (out_len - 1) * cm.decode_time(batch, ctx) / self.scale
                best_e2e = min(best_e2e, (e2e, v.name))
        missed = ""
        if slo.ttft_s is not None and waited + best_ttft[0] > slo.ttft_s:
            missed = f"TTFT target {slo.ttft_s * 1e3:.0f} ms (at least {best_ttft[0] * 1e3:.0f} ms"
            where = best_ttft[1]
        elif slo.deadline_s is not None and waited + best_e2e[0] > slo.deadline_s:
            missed = f"deadline {slo.deadline_s:.3f} s (at least {best_e2e[0]:.3f} s"
            where = best_e2e[1]
        if missed:
            raise self._refuse(
                f"the request's {missed} at {where}, the best replica) can no longer be met",
                "deadline",
            )
