"""Disaggregated prefill/decode: per-role views and the KV transfers in flight.

With replica groups of role ``prefill`` and ``decode`` (DistServe's and Splitwise's
split), a request's life in the cluster is:

1. routed (the cluster's router, over :attr:`KVHandoff.views` ``["prefill"]``: only prefill
   replicas) to a prefill replica, which runs its prompt and emits its first token there —
   TTFT ends on the prefill replica;
2. handed off (:meth:`Request.hand_off <sloserve.core.request.Request.hand_off>`): it leaves
   that replica, whose KV blocks for it are freed, and its prompt's KV moves over the
   KV link: ``latency + tokens × KV bytes per token per GPU / link rate``
   (:func:`~sloserve.costmodel.transfer.kv_transfer_time`; every GPU of a
   tensor-parallel replica sends its own shard, in parallel);
3. when the transfer is done, routed (the decode router, over the decode replicas) to a
   decode replica, which allocates the blocks of the ``num_prompt_tokens`` computed tokens
   on admission (no recompute) and decodes the rest one token per step.

Token accounting (DESIGN.md): after the prefill, ``num_computed_tokens == prompt`` and one
token is out; the first output token's KV is not computed yet — the first decode step
computes it and emits token 2. So the transfer carries the KV of the ``prompt`` tokens
that exist (not prompt+1).

Timing: the transfer lies between token 1 and token 2, so it is part of the second
token's gap and appears in no later gap; TPOT ``(t_last − t_first)/(n − 1)`` therefore
includes it exactly once (``max_gap_s`` shows it when it is the longest gap).

Failures: a failure of the prefill replica a transfer leaves from loses the transfer (the
KV's source is gone): the request goes back from scratch (a failover: the prefill replica
again, the client's first token not delivered twice). The decode replica is chosen only
when the transfer is done, so no decode replica's failure touches a transfer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sloserve.cluster.replica import Replica, ReplicaSpec, SimReplicaView
from sloserve.cluster.view import ClusterView
from sloserve.core.errors import ConfigError
from sloserve.core.request import Request

TransferTime = Callable[[ReplicaSpec, Request], float]
"""Seconds to move ``request``'s KV off a replica of ``spec`` (a prefill replica)."""

DECODE_QUEUE = "/decode"
"""Suffix of the global queue's key for handed-off requests waiting for a decode replica."""


@dataclass(slots=True)
class Transfer:
    """One KV transfer in flight."""

    req: Request
    source: Replica
    start: float
    end: float


class KVHandoff:
    """The prefill and decode views routers see, and the transfers in flight."""

    def __init__(
        self, replicas: Iterable[Replica], transfer_time: TransferTime, clock: Callable[[], float]
    ) -> None:
        reps = list(replicas)
        self.transfer_time = transfer_time
        self.views = {
            role: ClusterView((SimReplicaView(r) for r in reps if r.spec.role == role), clock)
            for role in ("prefill", "decode")
        }
        self.in_flight: dict[int, Transfer] = {}
        self.durations: list[float] = []
        """Seconds of every completed transfer."""
        self.lost = 0
        """Transfers lost to a failure of their source replica."""

    @classmethod
    def of(
        cls,
        replicas: Sequence[Replica],
        transfer_time: TransferTime | None,
        clock: Callable[[], float],
    ) -> KVHandoff | None:
        """The hand-off of a cluster of ``replicas``; None when every replica does both."""
        roles = {r.spec.role for r in replicas}
        if roles == {"both"}:
            return None
        if roles != {"prefill", "decode"} or transfer_time is None:
            raise ConfigError(
                "disaggregated serving needs prefill and decode replicas (and no 'both') "
                f"and a KV transfer time (roles: {', '.join(sorted(roles))})"
            )
        return cls(replicas, transfer_time, clock)

    def view_for(self, req: Request) -> ClusterView:
        """Decode replicas for a request that has its first token, else prefill replicas."""
        return self.views["decode" if req.num_output_tokens else "prefill"]

    def start(self, source: Replica, req: Request, now: float) -> float:
        """A transfer of ``req``'s KV leaves ``source`` now; returns when it is done."""
        end = now + self.transfer_time(source.spec, req)
        self.in_flight[req.req_id] = Transfer(req, source, now, end)
        return end

    def done(self, req: Request, end: float) -> bool:
        """The transfer of ``req`` ending at ``end`` is done; False when it was lost or
        aborted meanwhile (a stale event)."""
        t = self.in_flight.get(req.req_id)
        if t is None or t.req is not req or t.end != end:
            return False
        del self.in_flight[req.req_id]
        self.durations.append(t.end - t.start)
        return True

    def lose(self, source: Replica, now: float) -> list[Request]:
        """``source`` failed now: its transfers in flight are lost; their requests go back
        to WAITING from scratch (a failover), returned by arrival."""
        gone = [t for t in self.in_flight.values() if t.source is source]
        for t in gone:
            del self.in_flight[t.req.req_id]
            t.req.requeue_after_failure(now, t.req.streamed_times)
        self.lost += len(gone)
        return sorted((t.req for t in gone), key=lambda r: (r.arrival, r.req_id))

    def take_all(self) -> list[Request]:
        """Every request in transfer, by id, forgotten here (the run ends)."""
        out = sorted((t.req for t in self.in_flight.values()), key=lambda r: r.req_id)
        self.in_flight.clear()
        return out

    def drop(self, req: Request) -> bool:
        """Forget ``req``'s transfer (its client went away, or the run ended)."""
        return self.in_flight.pop(req.req_id, None) is not None


def pools(spec: ReplicaSpec) -> tuple[str, str]:
    """The global-queue keys a replica pulls from when it has room: its model's and that of
    requests that name no model (``default``), the decode queues for a decode replica."""
    suffix = DECODE_QUEUE if spec.role == "decode" else ""
    return spec.model + suffix, "default" + suffix


def queue_key(req: Request) -> str:
    """Where a held request waits: handed-off ones (they have a token) for a decode
    replica, the rest for a prefill (or co-located) one."""
    return req.model + DECODE_QUEUE if req.num_output_tokens else req.model
