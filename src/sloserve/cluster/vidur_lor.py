"""``vidur-lor``: Vidur's least-outstanding-requests global scheduler, exactly as Vidur has it.

Vidur's ``LORGlobalScheduler`` (microsoft/vidur, ``scheduler/global_scheduler/
lor_global_scheduler.py``) sends each request to the replica with the fewest *pending*
requests, where pending is the length of the replica scheduler's request queue: requests
waiting for their (re)prefill, not the ones running or preempted-and-resumable. Ties go to
the first replica in id order (Python's ``min`` over the replicas' dict), so with short
queues the load piles onto the first replicas.

This router reproduces that for agreement runs against Vidur
(``benchmarks/vidur_agreement.py``): it scores ``waiting`` (our replicas' queue of requests
not yet holding KV, which is where a recompute-preempted request goes back, as in Vidur)
and picks the lowest, ties to the lowest replica id. It is not a good router — it ignores
running work — and is kept apart from ``least-outstanding``, which counts everything a
replica holds and breaks ties in rotation.
"""

from __future__ import annotations

from sloserve.cluster.routing import PipelineRouter, Router, Scorer, register_router
from sloserve.cluster.view import ReplicaView, RouteRequest


def waiting_score(req: RouteRequest, r: ReplicaView) -> float:
    """Requests queued at the replica for their (re)prefill (Vidur's ``num_pending_requests``)."""
    return float(r.waiting)


def first_lowest(cand: list[ReplicaView], scores: list[float]) -> ReplicaView:
    """The lowest score; ties to the first candidate (candidates come in replica-id order)."""
    best = min(scores)
    return next(c for c, s in zip(cand, scores, strict=True) if s <= best)


def vidur_lor(seed: int) -> Router:
    """A fresh ``vidur-lor`` router (``seed`` unused: the router is deterministic)."""
    # It reads the waiting count, which a replica's fast-forwarded decode run can change
    # (a preemption puts a request back in the queue), so it keeps every replica stopping
    # at every event.
    return PipelineRouter(
        "vidur-lor", [], [Scorer("waiting", waiting_score)], first_lowest, reads_progress=True
    )


register_router(
    "vidur-lor",
    vidur_lor,
    "Vidur's LOR: fewest requests waiting for prefill, ties to the lowest replica id",
)
