"""The emulated backend: a simulated cluster stepped in wall-clock time.

The replicas are a :class:`~sloserve.cluster.cluster.Cluster` (what ``sloserve simulate
--replicas N`` runs) described by a :class:`~sloserve.cluster.config.ClusterConfig`
(replica groups, the router, scheduled failures and drains) and built as the simulation
builds them (:func:`sloserve.experiments.cluster_run.group_configs`,
:func:`sloserve.experiments.runner.build_instance`), on one
:class:`~sloserve.engine.env.Environment`. Routing (a :mod:`sloserve.cluster.routing`
router over the cluster's live ``ClusterView``), the global queue of held requests,
replica lifecycle (joins, drains, failures with fail-over) and ``ReplicaStatus`` are the
cluster's. What this module adds is the clock, the token streams and admission.

Simulated time is mapped onto the event loop's monotonic clock,
``sim = (loop.time() - t0) * time_scale``: one timer sleeps until the wall time of the next
event, steps every event that is due, then streams the tokens those iterations generated —
one :class:`TokenChunk` per token, deterministic filler text
(:func:`sloserve.serve.schemas.filler_text`). The engines run with ``multi_step=False`` so
each iteration is its own event and tokens leave at their iteration's end.

Choices (parameters of :class:`EmulatedConfig`):

* A new request arrives at the current wall time: due events are stepped first (the
  replicas' state is current, the clock is now), then the cluster routes it at once (an
  idle replica starts an iteration immediately, as a real engine would). A router
  :class:`~sloserve.cluster.routing.Hold` keeps it in the cluster's global queue until a
  replica of its model has room (``queue_size`` counts those); its stream just waits.
* When the event loop falls behind, due events are processed late, in order, on the
  engines' unchanged timelines: the tokens reach the client late (the live scheduling
  overhead the sim-vs-live benchmark reports).
* ``time_scale`` > 1 runs the emulation faster than real time (tests, demos): every
  simulated duration is divided by it, so client-side latencies are simulated ones divided
  by ``time_scale``. SLO targets are handed to the engine and the router unscaled (they
  read them in simulated seconds).
* Output length: the request's ``output_tokens`` if the gateway chose one, else a draw from
  ``output_length`` (a :mod:`~sloserve.workloads.lengths` distribution, seeded), else
  ``max_tokens``; always capped by ``max_tokens`` and raised to vLLM's ``min_tokens``. A
  request that ends before ``max_tokens`` finishes with ``stop``, one that reaches it with
  ``length``.
* Admission comes before routing (the cluster's order: admission, then the router), over
  the replicas that are up and serve the request's model: none → 503 ``no_backend``.
  ``max_queue`` caps waiting requests (429 ``queue_full``, or ``shed`` for sheddable
  requests, which a more important arrival displaces) and ``admission="slo"`` refuses a
  real-time request that cannot meet its target (429 ``deadline``): see
  :mod:`~sloserve.serve.emulated_admission`.
* A client disconnect aborts the request (:meth:`Cluster.abort`: out of the global queue,
  or on its replica at once when it is queued, at the end of the in-flight iteration when
  it is in it), freeing its KV cache.
* The engine's own rejection (the request can never fit the KV cache M under the policy)
  ends the stream with a 400 ``exceeds_kv_capacity`` before any token.
* An exception from an engine (a policy that stalls with work waiting, a
  ``SchedulerViolation``) ends every open stream of that replica with a 500
  ``engine_error``; the replica fails and recovers at once through the cluster (a fresh
  engine: empty KV, fresh policy state) and keeps serving new requests. The replica is
  found from the traceback (the ``Instance`` whose event raised); if none is, every
  replica is reset.
* A scheduled failure (``cluster.failures``, simulated seconds after :meth:`start`) is the
  simulation's: the replica's requests are served elsewhere from scratch and their streams
  go on where they were (no token is sent twice). Drains and joins likewise.
* Model names: a group's ``model``, else ``served_model_name`` for groups that run the
  default profile, else the profile's model name; clients must name one of them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sloserve.cluster.cluster import Cluster, ConservationError
from sloserve.cluster.replica import Replica, ReplicaSpec
from sloserve.cluster.routing import Router, make_router
from sloserve.cluster.view import ReplicaStatus, RouteRequest
from sloserve.core.errors import ConfigError
from sloserve.core.request import Request, RequestClass, RequestStatus
from sloserve.costmodel.profile import load_profile
from sloserve.engine.env import Environment
from sloserve.engine.instance import Instance
from sloserve.experiments.cluster_run import group_configs
from sloserve.experiments.runner import SimConfig, build_instance
from sloserve.policies.registry import make_policy
from sloserve.serve.backend import (
    Backend,
    FinishReason,
    GenerationRequest,
    ReplicaState,
    ServeError,
    TokenChunk,
)
from sloserve.serve.emulated_admission import EmulatedAdmission
from sloserve.serve.emulated_config import EmulatedConfig as EmulatedConfig  # re-exported
from sloserve.serve.emulated_prefix import prompt_block_ids
from sloserve.serve.emulated_stream import _FILLER_CHUNKS, _Stream, _TokenStream
from sloserve.serve.schemas import filler_text

log = logging.getLogger("sloserve.serve")


def _culprit(e: BaseException, replicas: Sequence[Replica]) -> Replica | None:
    """The replica whose engine raised ``e``: the first ``Instance`` frame in its traceback
    (events are plain callbacks on the shared clock, so the event itself does not say)."""
    by_inst = {id(r.instance): r for r in replicas if r.instance is not None}
    tb = e.__traceback__
    while tb is not None:
        rep = by_inst.get(id(tb.tb_frame.f_locals.get("self")))
        if rep is not None:
            return rep
        tb = tb.tb_next
    return None


class EmulatedBackend(EmulatedAdmission, Backend):
    """A simulated cluster behind the gateway, in wall time (see the module docstring)."""

    name = "emulated"

    def __init__(self, config: EmulatedConfig, router: Router | None = None) -> None:
        self.config = config
        make_policy(config.policy, config.policy_params)  # fail early on a bad policy
        ccfg = config.cluster_config()
        ccfg.check(horizon_s=None, profile=config.instance.profile, policy=config.policy)
        self.cluster_config = ccfg
        """The cluster this backend runs (``config.cluster`` or built from its fields)."""
        sim = SimConfig(
            instance=config.instance.model_copy(update={"multi_step": False}),
            policy=config.policy,
            policy_params=config.policy_params,
        )
        self._group_cfgs = group_configs(sim, ccfg)
        profiles = [load_profile(g.instance.profile) for g in self._group_cfgs]
        self.profile = profiles[0]
        specs = []
        for rid, gi in enumerate(ccfg.group_of()):
            g, gcfg = ccfg.replicas[gi], self._group_cfgs[gi]
            if g.model is not None:
                model = g.model
            elif g.profile is None and config.served_model_name:
                model = config.served_model_name
            else:
                model = profiles[gi].model.name
            specs.append(ReplicaSpec(rid, gi, gcfg.instance.profile, gcfg.policy, model, g.start_s))
        self.specs = specs
        self._contexts = [p.model.max_context for p in profiles]
        rparams = dict(ccfg.router_params)
        seed = int(rparams.pop("seed", config.seed))
        self.router = router or make_router(ccfg.router, rparams, seed=seed)
        """The router: a :mod:`sloserve.cluster.routing` object, as in simulation."""
        self.scale = config.time_scale
        # Timer callbacks may fire up to the clock's resolution early: count those as due.
        self.eps = time.get_clock_info("monotonic").resolution * self.scale + 1e-12
        self.model_name = specs[0].model
        self._rng = np.random.default_rng(config.seed)
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cluster: Cluster | None = None
        self.env = Environment()
        self.t0 = 0.0
        self.stopping = False
        self._streams: dict[int, _Stream] = {}
        """Open streams by engine request id (a request keeps its id across fail-overs)."""
        self._ended: list[Request] = []
        self._iters: dict[int, int] = {}
        """Iterations already streamed, by instance id."""
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.log: list[tuple[str, int, Request]] | None = None
        """Set to a list to keep ``(request_id, replica, engine request)`` of every ended
        stream (benchmarks: :meth:`token_times` gives when the engine emitted its tokens)."""

    # ---------------------------------------------------------------- clock
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the backend was started in."""
        if self._loop is None:
            raise ServeError("the emulated backend is not started", reason="not_started")
        return self._loop

    @property
    def cluster(self) -> Cluster:
        """The running cluster (after :meth:`start`)."""
        if self._cluster is None:
            raise ServeError("the emulated backend is not started", reason="not_started")
        return self._cluster

    def sim_now(self) -> float:
        """Simulated seconds since :meth:`start`."""
        return (self.loop.time() - self.t0) * self.scale

    def wall_of(self, sim_t: float) -> float:
        """The event loop time at which simulated time ``sim_t`` falls."""
        return self.t0 + sim_t / self.scale

    def kick(self) -> None:
        """Step every event due by now, stream the new tokens, sleep until the next one."""
        if self.timer is not None:  # called early (an arrival): this pass replaces the timer
            self.timer.cancel()
        self.timer = None
        self.timer_at = math.inf
        env = self.env
        now = self.sim_now() + self.eps
        stepped = False
        while env.peek() <= now:
            stepped = True
            try:
                env.step()
            except Exception as e:  # a policy that stalls or breaks a limit, or a bug
                self._emit()
                self._engine_failed(e)
        env.run(until=now)  # nothing is due: the clock is now (arrivals enter at now)
        if stepped or self._ended:
            self._emit()
        self._arm()

    def _arm(self) -> None:
        nxt = self.env.peek()
        if nxt == math.inf:
            return
        when = self.wall_of(nxt)
        if self.timer is not None:
            if self.timer_at <= when:
                return
            self.timer.cancel()
        self.timer = self.loop.call_at(when, self.kick)
        self.timer_at = when

    def _engine_failed(self, e: Exception) -> None:
        """An engine raised: end its open streams with an explicit error, abort what it
        held, and restart it through the cluster (fail, then recover: a fresh engine)."""
        clu = self.cluster
        culprit = _culprit(e, clu.replicas)
        reps = [culprit] if culprit is not None else [r for r in clu.replicas if r.instance]
        err = ServeError(
            f"engine error: {type(e).__name__}: {e}", status=500, reason="engine_error"
        )
        for rep in reps:
            inst = rep.instance
            assert inst is not None
            mine = [s for s in self._streams.values() if s.req.instance_id == inst.instance_id]
            log.error("%s: %s: %s; its %d requests end with an error", f"replica-{rep.replica_id}",
                      type(e).__name__, e, len(mine))  # fmt: skip
            for s in mine:
                if not s.finish:
                    s.finish = True
                    s.push(err)
            inst.abort_all()
            clu.fail(rep)
            clu.recover(rep)

    # ---------------------------------------------------------------- streaming
    def _emit(self) -> None:
        streams = self._streams
        for rep in self.cluster.replicas:
            inst = rep.instance
            if inst is None or self._iters.get(inst.instance_id) == len(inst.iter_end):
                continue
            self._iters[inst.instance_id] = len(inst.iter_end)
            for r in inst.running:
                s = streams.get(r.req_id)
                if s is not None and r.num_output_tokens > s.sent:
                    self._push_tokens(s, r.num_output_tokens, None)
        if self._ended:
            # on_done appends to this very list object: copy, then empty it in place.
            ended = list(self._ended)
            self._ended.clear()
            for r in ended:
                s = streams.get(r.req_id)
                if s is None or s.finish:
                    continue
                if r.status is RequestStatus.FINISHED:
                    reason: FinishReason = (
                        "length" if r.num_output_tokens >= s.max_tokens else "stop"
                    )
                    self._push_tokens(s, r.num_output_tokens, reason)
                elif r.status is RequestStatus.REJECTED:
                    s.finish = True
                    s.push(ServeError(r.reject_reason, status=400, reason="exceeds_kv_capacity"))
                elif r.status is RequestStatus.ABORTED:
                    if r.num_output_tokens > s.sent:
                        self._push_tokens(s, r.num_output_tokens, None)
                    s.finish = True
                    s.push(ServeError("the request was aborted", status=503, reason="aborted"))

    def _push_tokens(self, s: _Stream, upto: int, finish: FinishReason | None) -> None:
        put = s.items.append
        ends = finish is not None and upto > s.sent
        last = upto - 1 if ends else upto
        n = len(_FILLER_CHUNKS)
        for i in range(s.sent, last):
            put(_FILLER_CHUNKS[i % n])  # immutable: shared, not built per token
        if ends:
            s.finish = True
            put(TokenChunk(filler_text(last), 1, finish, s.prompt_tokens))
        s.sent = upto
        s.wake()

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        if self._loop is not None:
            raise ConfigError("the emulated backend is already started")
        self._loop = asyncio.get_running_loop()
        self.t0 = self._loop.time()
        clu = Cluster(self.env, self.specs, self._make_instance, self.router)
        clu.on_done = self._ended.append
        for f in self.cluster_config.failures:
            clu.schedule_failure(f.replica, f.at_s, f.recover_s)
        for d in self.cluster_config.drains:
            clu.schedule_drain(d.replica, d.at_s)
        self._cluster = clu
        self._arm()

    def _make_instance(self, spec: ReplicaSpec, instance_id: int) -> Instance:
        """A replica's engine (the cluster calls this at a join and at a recovery)."""
        gcfg = self._group_cfgs[spec.group]
        return build_instance(gcfg, self.env, check_invariants=False, instance_id=instance_id)

    async def _quiesce(self) -> None:
        """Before :meth:`stop` ends the streams left: nothing to wait for here (the
        local backend waits for its forward pass in flight)."""

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        self.stopping = True
        deadline = time.monotonic() + drain_timeout_s
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self._quiesce()
        for s in list(self._streams.values()):
            if not s.finish:
                s.finish = True
                s.push(ServeError("the server is shutting down", status=503, reason="shutdown"))
            self.release(s)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self._cluster is not None:
            try:  # the engines stop here: nothing in flight survives
                self._cluster.close(self.env.now)
            except ConservationError as e:  # a cluster bug: say so, but shut down
                log.error("emulated cluster: %s", e)

    # ---------------------------------------------------------------- requests
    def _output_len(self, req: GenerationRequest) -> int:
        cap = req.max_tokens
        if req.output_tokens is not None:
            n = req.output_tokens
        elif self.config.output_length is not None:
            n = int(self.config.output_length.sample(self._rng, 1)[0])
        else:
            n = cap
        floor = req.body.get("min_tokens") or 0
        return max(1, min(cap, max(n, int(floor))))

    def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        return _TokenStream(self, req)

    async def admit(self, req: GenerationRequest) -> _Stream:
        """Admit ``req`` (the stream's first ``__anext__``); a coroutine so that a
        backend may wait for its engine first (the local backend's forward pass)."""
        return self._admit(req)

    def _admit(self, req: GenerationRequest) -> _Stream:
        """Admit ``req`` (or raise :class:`ServeError`) and hand it to the cluster now."""
        if self._loop is None:
            raise ServeError("the emulated backend is not started", reason="not_started")
        if self.stopping:
            raise ServeError("the server is shutting down", status=503, reason="shutdown")
        self.kick()  # due events first: the replicas' state is current, the clock is now
        clu = self.cluster
        up = [v for v in clu.view.serving(req.model) if v.status is ReplicaStatus.UP]
        if not up:
            raise ServeError(
                f"no replica serving {req.model!r} is up",
                status=503,
                reason="no_backend",
                retry_after_s=self.config.retry_after_s,
            )
        victim = self._admit_queue(up, req)
        out_len = self._output_len(req)
        if self.config.admission == "slo" and req.request_class is RequestClass.RT:
            self._admit_slo(up, req, out_len)
        r = Request(
            req_id=next(self._ids),
            arrival=self.env.now,
            num_prompt_tokens=req.prompt_tokens,
            true_output_len=out_len,
            req_class=req.request_class,
            priority=req.priority,
            model=req.model,
            slo=req.slo,
            qoe=req.qoe,
            max_tokens=req.max_tokens,
            hash_ids=prompt_block_ids(req.body),  # the engines' prefix caches match these
        )
        stream = _Stream(r, req.request_id, req.max_tokens, req.prompt_tokens, req.sheddable)
        self._streams[r.req_id] = stream
        try:
            clu.add_request(r)  # routed now, or held in the global queue
        except Exception as e:  # a router that breaks the contract (a plugin's bug)
            self._streams.pop(r.req_id, None)
            log.exception("router %r failed", self.router.name)
            raise ServeError(
                f"router error: {type(e).__name__}: {e}", status=500, reason="router_error"
            ) from None
        if victim is not None:  # admitted: it takes the place of a sheddable waiter
            self._shed(victim)
        self.kick()
        return stream

    def release(self, stream: _Stream) -> None:
        """The consumer is gone: abort the request if it is still live (frees its KV)."""
        r = stream.req
        if self._streams.pop(r.req_id, None) is not None and self.log is not None:
            reps = self.cluster.replicas
            rid = next((p.replica_id for p in reps for i in p.incarnations
                        if i.instance_id == r.instance_id), -1)  # fmt: skip
            self.log.append((stream.request_id, rid, r))
        if not r.status.is_terminal and self._cluster is not None and self._cluster.abort(r):
            self.kick()

    # ---------------------------------------------------------------- state
    def replicas(self) -> Sequence[ReplicaState]:
        clu = self._cluster
        if clu is None:
            return []
        flying = Counter(s.req.instance_id for s in self._streams.values())
        out = []
        for rep in clu.replicas:
            v = clu.view.replica(rep.replica_id)
            ttft = v.predicted_ttft_s(RouteRequest(-1, v.model, 0))
            out.append(
                ReplicaState(
                    name=v.name,
                    healthy=v.status is ReplicaStatus.UP and not self.stopping,
                    running=v.running,
                    waiting=v.waiting + v.swapped,
                    kv_usage=v.kv_usage,
                    in_flight=sum(flying[i.instance_id] for i in rep.incarnations),
                    queued_prompt_tokens=v.queued_prompt_tokens,
                    predicted_ttft_s=None if ttft is None else ttft / self.scale,
                )
            )
        return out

    @property
    def queue_size(self) -> int:
        """Requests held in the cluster's global queue (a router's :class:`Hold`)."""
        clu = self._cluster
        return 0 if clu is None else sum(len(q) for q in clu.queue.values())

    def models(self) -> Sequence[str]:
        return tuple(dict.fromkeys(s.model for s in self.specs))

    def max_context(self) -> int | None:
        known = [c for c in self._contexts if c is not None]
        return max(known) if known else None

    def check_params(self, body: dict[str, Any]) -> list[str]:
        stop = body.get("stop")
        return ["stop (the emulated backend streams filler text)"] if stop else []

    @property
    def healthy(self) -> bool:
        clu = self._cluster
        return (
            clu is not None
            and not self.stopping
            and any(r.status is ReplicaStatus.UP for r in clu.replicas)
        )

    # ---------------------------------------------------------------- introspection
    def engine_read(self) -> AbstractContextManager[Any]:
        """A context in which the event loop may read the engines' state (``/metrics``):
        always, here; the local backend's worker thread must not be mid-step."""
        return nullcontext()

    def instances(self) -> list[Instance]:
        """The engine of every replica that has started (its latest incarnation), in
        replica order (tests and benchmarks read their state)."""
        return [r.incarnations[-1] for r in self.cluster.replicas if r.incarnations]

    def token_times(self, replica: int, req: Request) -> NDArray[np.float64]:
        """Event-loop (monotonic) times at which the engine emitted ``req``'s tokens: the
        ends of their iterations, mapped to wall time (when they were due, not when the
        loop got to them). ``replica``: where it ran (its last engine is looked up)."""
        incs = self.cluster.replicas[replica].incarnations
        inst = next(i for i in incs if i.instance_id == req.instance_id)
        ends = np.asarray(inst.iter_end, dtype=np.float64)
        return self.t0 + ends[np.asarray(req.token_iterations(), dtype=np.int64)] / self.scale
