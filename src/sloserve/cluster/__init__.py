"""The cluster layer: many replicas on one clock behind admission and a router.

Milestone 2 adds (see each module's docstring and docs/cluster.md): the model registry,
cold starts and model swaps (``models``, ``transfer``, ``cold_start``, ``model_swaps``;
``cluster/models.py``), admission (``admission``; ``cluster/admission.py``), routing
decisions as data (``trace_decisions``), and controllers with the utilisation autoscaler
(``autoscaler``; ``cluster/controller.py``), and disaggregated prefill/decode (group
``role``: prefill replicas emit the first token, the KV moves over ``transfer.kv_link_*``,
decode replicas take it with its KV; ``cluster/handoff.py``).

Layer: above engine/policies/optimal, below experiments/serve. Entry point for runs:
``sloserve.experiments.cluster_run.simulate_cluster(sim_config, ClusterConfig(...))``; a
one-replica ``ClusterConfig()`` with the ``pass-through`` router reproduces
``runner.simulate`` exactly (summary, request table, trace), plus the cluster's columns.

Config (:class:`ClusterConfig`, frozen, unknown keys are errors; ``ClusterConfig.load``
turns a mapping into it with one-line errors; the run checks names and times first):

- ``replicas``: groups, numbered 0.. in order. Per group: ``count`` (>= 1), ``profile``,
  ``policy``, ``policy_params`` (unset: the run's; the run's params only when the policy is
  the run's), ``start_s`` (join time), ``model`` (routing key; unset: the profile's model
  name), and instance limits ``max_running``, ``max_batch_tokens``, ``chunk_size``,
  ``block_size``, ``kv_utilization``, ``kv_capacity_tokens``, ``cpu_swap_gib`` (unset: the
  run's ``InstanceConfig``).
- ``router`` and ``router_params`` (``seed`` defaults to the workload's seed).
- ``failures``: ``{replica, at_s, recover_s?}``; ``drains``: ``{replica, at_s}``; times must
  lie in ``[start_s of that replica, horizon)``, ``recover_s`` after ``at_s``.

Routers (Filter → min-max normalised weighted Scorers → Picker over a read-only
:class:`ClusterView`; candidates are the UP replicas serving the request's model; a request
with model ``"default"`` may go anywhere; no candidate means hold):

- ``pass-through``: the first candidate (a single replica: itself).
- ``random``: uniform, seeded.
- ``round-robin``: candidates in turn, per model.
- ``least-outstanding``: fewest requests held (Vidur's LOR); ``max_outstanding=N`` holds
  the request in the global queue while every replica holds N, pulled when one has room.
- ``jsq-tokens``: fewest prompt tokens still to prefill (outstanding as a 0.1 tie-break).
- ``power-of-two``: the less loaded of two seeded samples.
- ``least-kv``: lowest KV usage.
- ``slo-aware``: among replicas whose predicted TTFT meets the request's TTFT target (all
  if none does), the lowest predicted TTFT (+ 0.25 × KV usage).

Lifecycle and failure semantics: a replica joins at ``start_s``; a drain stops routing to
it and it leaves when empty; a failure returns every request it held to the global layer
(KV lost, GPU and CPU tier) and routes them again at once, from scratch, keeping their
arrival time; a recovery starts a fresh engine (new instance id, empty KV, fresh policy
state); a draining replica that fails leaves. A failed-over request's client timeline is
the tokens streamed before the failure followed by the new replica's tokens beyond them
(the regenerated ones are not delivered twice): TTFT is the first token the client ever
got, TPOT is over that client timeline (the failover stall included, visible in
``max_gap_s``), ``queue_s`` is from the first scheduling. Held requests wait in the
per-model global queue (FIFO, no overtaking) and are aborted at the horizon (reason
``horizon``), or ``no_replica`` when the run runs out of events with nothing to serve
them. Every request ends exactly once; the cluster raises :class:`ConservationError`
otherwise. Accounting: GPU-seconds from join to leave (failed time included), utilisation
is busy time over GPU-seconds.
"""

from sloserve.cluster.cluster import Cluster, ConservationError
from sloserve.cluster.config import ClusterConfig, Drain, Failure, ReplicaGroup
from sloserve.cluster.prefix_routing import (  # importing it registers its routers
    PrefixRouter,
    SessionAffinityRouter,
    text_block_ids,
)
from sloserve.cluster.routing import (
    Hold,
    PipelineRouter,
    Router,
    Scorer,
    make_router,
    register_router,
    router_names,
)
from sloserve.cluster.view import (
    ClusterView,
    ReplicaStatus,
    ReplicaView,
    RouteRequest,
    StaticReplica,
)

__all__ = [
    "Cluster",
    "ClusterConfig",
    "ClusterView",
    "ConservationError",
    "Drain",
    "Failure",
    "Hold",
    "PipelineRouter",
    "PrefixRouter",
    "ReplicaGroup",
    "ReplicaStatus",
    "ReplicaView",
    "RouteRequest",
    "Router",
    "Scorer",
    "SessionAffinityRouter",
    "StaticReplica",
    "make_router",
    "register_router",
    "router_names",
    "text_block_ids",
]

# Aladdin's router and QLM's (qlm, edf, fcfs, ...) register themselves when their packages
# are imported: ``cluster/routing.py`` does so the first time one of their names is asked
# for (start-up time: a run with another router never imports them).
