"""The emulated backend: replicas of the simulation engine stepped in wall-clock time.

Each replica is an :class:`~sloserve.engine.instance.Instance` built exactly as
``simulate`` builds one (:func:`sloserve.experiments.runner.build_instance`: profile, limits
C/P/M/R_max, policy, predictor), with its own :class:`~sloserve.engine.env.Environment`.
Simulated time is mapped onto the event loop's monotonic clock,
``sim = (loop.time() - t0) * time_scale``: a timer sleeps until the wall time of the next
event, steps every event that is due, then streams the tokens those iterations generated —
one :class:`TokenChunk` per token, deterministic filler text
(:func:`sloserve.serve.schemas.filler_text`). The engine runs with ``multi_step=False`` so
each iteration is its own event and tokens leave at their iteration's end.

Choices (parameters of :class:`EmulatedConfig`):

* A new request arrives at the current wall time, ``max(env.now, sim_now)``, and is stepped
  at once (an idle replica starts an iteration immediately, as a real engine would).
* When the event loop falls behind (a busy gateway), due events are processed late, in
  order, and the engine's timeline is unchanged: the simulated GPU kept its schedule, the
  tokens reach the client late. That lateness is the live scheduling overhead the
  sim-vs-live benchmark reports.
* ``time_scale`` > 1 runs the emulation faster than real time (tests, demos): every
  simulated duration is divided by it, so client-side latencies are simulated ones divided
  by ``time_scale``.
* Output length: the request's ``output_tokens`` if the gateway chose one, else a draw from
  ``output_length`` (a :mod:`~sloserve.workloads.lengths` distribution, seeded), else
  ``max_tokens``; always capped by ``max_tokens`` and raised to vLLM's ``min_tokens``. A
  request that ends before ``max_tokens`` finishes with ``stop``, one that reaches it with
  ``length``.
* Admission: ``max_queue`` caps the waiting requests of the replica the router picked; a
  full queue answers 429 (``queue_full``) with ``Retry-After`` of ``retry_after_s``. With
  ``admission="slo"`` a real-time request is also refused (429 ``deadline``) when a lower
  bound of its latency already misses its target: TTFT ≥ the cost model's prefill time of
  the prompt tokens queued at the replica plus its own; end-to-end ≥ that plus one decode
  step per output token at the current batch size and context. A lower bound, so a
  refused request could not have been served in time; best-effort requests are never
  refused for SLOs.
* A client disconnect aborts the request (:meth:`Instance.abort`: at once when it is
  queued, at the end of the in-flight iteration when it is in it), freeing its KV cache.
* The engine's own rejection (the request can never fit the KV cache M under the policy)
  ends the stream with a 400 ``exceeds_kv_capacity`` before any token.
* An exception from the engine (a policy that stalls with work waiting, a
  ``SchedulerViolation``) ends every open stream of that replica with a 500
  ``engine_error`` and resets the replica; it keeps serving new requests.
* ``predicted_ttft_s`` of a replica is the cost model's prefill time of the prompt tokens
  queued there (the work ahead of a new request), for the ``slo-aware`` router.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloserve.core.errors import ConfigError
from sloserve.core.request import Request, RequestClass, RequestStatus
from sloserve.costmodel.profile import load_profile
from sloserve.engine.env import PRIO_ARRIVAL, Environment
from sloserve.engine.instance import Instance
from sloserve.experiments.runner import InstanceConfig, SimConfig, build_instance
from sloserve.policies.registry import make_policy
from sloserve.serve.backend import (
    Backend,
    FinishReason,
    GenerationRequest,
    ReplicaState,
    Router,
    ServeError,
    TokenChunk,
)
from sloserve.serve.schemas import FILLER_WORDS, filler_text
from sloserve.workloads.lengths import LengthDist

log = logging.getLogger("sloserve.serve")


class EmulatedConfig(BaseModel):
    """The emulated backend: ``replicas`` identical replicas of one profile and policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance: InstanceConfig = Field(
        default_factory=InstanceConfig,
        description="profile and limits of each replica (multi_step is always off live)",
    )
    policy: str = Field(default="vllm", description="per-instance policy (sloserve policies)")
    policy_params: dict[str, Any] = Field(default_factory=dict)
    replicas: int = Field(default=1, ge=1, le=64)
    router: str = Field(default="least-loaded", description="see sloserve.serve.routing")
    time_scale: float = Field(
        default=1.0, gt=0, le=1000, description="simulated seconds per wall second"
    )
    output_length: LengthDist | None = Field(
        default=None, description="output-length distribution (else max_tokens)"
    )
    seed: int = 0
    max_queue: int | None = Field(
        default=None, ge=1, description="waiting requests per replica before 429"
    )
    retry_after_s: float = Field(default=1.0, gt=0, description="Retry-After on a full queue")
    admission: Literal["none", "queue", "slo"] = Field(
        default="queue",
        description="'none' never answers 429; 'queue' when max_queue is reached; 'slo' also "
        "to a real-time request whose TTFT target or deadline can no longer be met",
    )

    @model_validator(mode="after")
    def _admission(self) -> EmulatedConfig:
        if self.admission == "none" and self.max_queue is not None:
            raise ValueError("max_queue needs admission 'queue' or 'slo', not 'none'")
        return self

    served_model_name: str | None = Field(
        default=None, description="the model name clients use (default: the profile's model)"
    )


_FILLER_CHUNKS = tuple(TokenChunk(filler_text(i), 1) for i in range(len(FILLER_WORDS)))
"""The chunks of non-final filler tokens (token ``i`` is ``_FILLER_CHUNKS[i % 16]``)."""


class _Stream:
    """One request's token buffer: the engine pushes, its :class:`_TokenStream` pops.

    A deque and one future rather than an ``asyncio.Queue``: this is the per-token path."""

    __slots__ = (
        "finish", "items", "max_tokens", "prompt_tokens", "req", "request_id", "sent", "waiter",
    )  # fmt: skip

    def __init__(self, req: Request, request_id: str, max_tokens: int, prompt_tokens: int) -> None:
        self.req = req
        self.request_id = request_id
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.items: deque[TokenChunk | ServeError] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.sent = 0
        self.finish = False

    def wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    def push(self, item: TokenChunk | ServeError) -> None:
        self.items.append(item)
        self.wake()


class _TokenStream:
    """What :meth:`EmulatedBackend.generate` returns: the request's chunks, in order.

    Admission runs at the first ``__anext__`` (errors come before the first chunk, as the
    contract says). :meth:`drain_nowait` hands over the chunks already produced without
    waiting, so that the API can write a backlog (a gateway that fell behind) in one go.
    Closing it (``aclose``), or an exception or cancellation while waiting, releases the
    request: aborted in the engine if it is still live.
    """

    __slots__ = ("_backend", "_closed", "_rep", "_req", "_stream")

    def __init__(self, backend: EmulatedBackend, req: GenerationRequest) -> None:
        self._backend = backend
        self._req = req
        self._rep: _Replica | None = None
        self._stream: _Stream | None = None
        self._closed = False

    def __aiter__(self) -> _TokenStream:
        return self

    async def __anext__(self) -> TokenChunk:
        s = self._stream
        if s is None:
            if self._closed:
                raise StopAsyncIteration
            self._rep, s = self._backend._admit(self._req)
            self._stream = s
        items = s.items
        try:
            while not items:
                if self._closed:
                    raise StopAsyncIteration
                s.waiter = self._backend.loop.create_future()
                await s.waiter
        except BaseException:
            self._close()
            raise
        item = items.popleft()
        if isinstance(item, ServeError):
            self._close()
            raise item
        if item.finish_reason is not None:
            self._close()
        return item

    def drain_nowait(self) -> list[TokenChunk]:
        """The chunks already produced (up to an error, which the next ``__anext__`` raises)."""
        s = self._stream
        out: list[TokenChunk] = []
        if s is None:
            return out
        items = s.items
        while items and not isinstance(items[0], ServeError):
            c = items.popleft()
            assert isinstance(c, TokenChunk)
            out.append(c)
            if c.finish_reason is not None:
                self._close()
                break
        return out

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._rep is not None and self._stream is not None:
            self._rep.release(self._stream)


class _Replica:
    """One Instance, its environment and the wall-clock timer that steps it."""

    def __init__(self, index: int, inst: Instance, backend: EmulatedBackend) -> None:
        self.index = index
        self.name = f"replica-{index}"
        self.inst = inst
        self.env: Environment = inst.env
        self.backend = backend
        self.streams: dict[int, _Stream] = {}
        self.ended: list[Request] = []
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        inst.on_done = self.ended.append

    # ---------------------------------------------------------------- clock
    def kick(self) -> None:
        """Step every event due by now, stream the new tokens, sleep until the next one."""
        if self.timer is not None:  # called early (an arrival): this pass replaces the timer
            self.timer.cancel()
        self.timer = None
        self.timer_at = math.inf
        env = self.env
        now = self.backend.sim_now() + self.backend.eps
        stepped = False
        try:
            while env.peek() <= now:
                env.step()
                stepped = True
        except Exception as e:  # a policy that stalls or breaks a limit, or a bug
            self._emit()
            self._fail(e)
        else:
            if stepped:
                self._emit()
        self._arm()

    def _fail(self, e: Exception) -> None:
        """The engine raised: end every open stream with an explicit error and reset the
        replica (its requests are aborted, their KV freed), so that nothing hangs."""
        log.error("replica %s: %s: %s; its %d requests end with an error", self.name,
                  type(e).__name__, e, len(self.streams))  # fmt: skip
        err = ServeError(
            f"engine error: {type(e).__name__}: {e}", status=500, reason="engine_error"
        )
        for s in self.streams.values():
            if not s.finish:
                s.finish = True
                s.push(err)
        self.inst.abort_all()
        self.ended.clear()

    def _arm(self) -> None:
        nxt = self.env.peek()
        if nxt == math.inf:
            return
        when = self.backend.wall_of(nxt)
        if self.timer is not None:
            if self.timer_at <= when:
                return
            self.timer.cancel()
        self.timer = self.backend.loop.call_at(when, self.kick)
        self.timer_at = when

    def _emit(self) -> None:
        streams = self.streams
        for r in self.inst.running:
            s = streams.get(r.req_id)
            if s is not None and r.num_output_tokens > s.sent:
                self._push_tokens(s, r.num_output_tokens, None)
        if self.ended:
            # on_done appends to this very list object: copy, then empty it in place.
            ended = list(self.ended)
            self.ended.clear()
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

    @staticmethod
    def _push_tokens(s: _Stream, upto: int, finish: FinishReason | None) -> None:
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

    # ---------------------------------------------------------------- requests
    def add(self, req: Request, stream: _Stream) -> None:
        self.streams[req.req_id] = stream
        self.env.schedule(req.arrival, partial(self._arrive, req, stream), PRIO_ARRIVAL)
        self.kick()

    def _arrive(self, req: Request, stream: _Stream) -> None:
        # A stream already ended (the engine failed on an earlier due event and reset the
        # replica) or released never enters the engine: it would be a request without a
        # consumer, holding KV cache and compute until it ran to its end.
        if stream.finish or self.streams.get(req.req_id) is not stream:
            if not req.status.is_terminal:
                req.abort(self.env.now)
            return
        self.inst.add_request(req)

    def release(self, stream: _Stream) -> None:
        """The consumer is gone: abort the request if it is still live (frees its KV)."""
        r = stream.req
        if self.streams.pop(r.req_id, None) is not None and self.backend.log is not None:
            self.backend.log.append((stream.request_id, self.index, r))
        if not r.status.is_terminal and self.inst.abort(r):
            self.kick()

    def state(self) -> ReplicaState:
        inst = self.inst
        kv = inst.kv
        queued = 0
        for r in inst.waiting:
            queued += r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
        return ReplicaState(
            name=self.name,
            healthy=not self.backend.stopping,
            running=len(inst.running),
            waiting=len(inst.waiting) + len(inst.swapped),
            kv_usage=kv.num_used_blocks / kv.num_blocks if kv.num_blocks else 0.0,
            in_flight=len(self.streams),
            queued_prompt_tokens=queued,
            predicted_ttft_s=inst.cost_model.prefill_time(queued) / self.backend.scale,
        )


class EmulatedBackend(Backend):
    """Replicas of the simulation engine behind the gateway (see the module docstring)."""

    name = "emulated"

    def __init__(self, config: EmulatedConfig, router: Router | None = None) -> None:
        from sloserve.serve.routing import make_router

        self.config = config
        make_policy(config.policy, config.policy_params)  # fail early on a bad policy
        self.profile = load_profile(config.instance.profile)
        self.router = router or make_router(config.router, seed=config.seed)
        self.scale = config.time_scale
        # Timer callbacks may fire up to the clock's resolution early: count those as due.
        self.eps = time.get_clock_info("monotonic").resolution * self.scale + 1e-12
        self.model_name = config.served_model_name or self.profile.model.name
        self._rng = np.random.default_rng(config.seed)
        self._ids = itertools.count()
        self._replicas: list[_Replica] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.t0 = 0.0
        self.stopping = False
        self._icfg = config.instance.model_copy(update={"multi_step": False})
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

    def sim_now(self) -> float:
        """Simulated seconds since :meth:`start`."""
        return (self.loop.time() - self.t0) * self.scale

    def wall_of(self, sim_t: float) -> float:
        """The event loop time at which simulated time ``sim_t`` falls."""
        return self.t0 + sim_t / self.scale

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        if self._loop is not None:
            raise ConfigError("the emulated backend is already started")
        self._loop = asyncio.get_running_loop()
        self.t0 = self._loop.time()
        sim = SimConfig(
            instance=self._icfg, policy=self.config.policy, policy_params=self.config.policy_params
        )
        self._replicas = [
            _Replica(i, build_instance(sim, Environment(), check_invariants=False), self)
            for i in range(self.config.replicas)
        ]

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        self.stopping = True
        deadline = time.monotonic() + drain_timeout_s
        while any(rep.streams for rep in self._replicas) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for rep in self._replicas:
            for s in list(rep.streams.values()):
                if not s.finish:
                    s.finish = True
                    s.push(ServeError("the server is shutting down", status=503, reason="shutdown"))
                rep.release(s)
            if rep.timer is not None:
                rep.timer.cancel()
                rep.timer = None
            rep.inst.abort_all()  # the engine stops here: nothing in flight survives

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

    def _admit_slo(self, rep: _Replica, req: GenerationRequest, out_len: int) -> None:
        """Raise 429 ``deadline`` when a lower bound of the request's latency misses its
        TTFT target or deadline (wall seconds, counted from the gateway's arrival)."""
        slo = req.slo
        if slo.ttft_s is None and slo.deadline_s is None:
            return
        inst = rep.inst
        cm = inst.cost_model
        waited = time.monotonic() - req.arrival
        queued = sum(r.remaining_compute for r in inst.waiting)
        ttft = cm.prefill_time(queued + req.prompt_tokens) / self.scale
        missed = ""
        if slo.ttft_s is not None and waited + ttft > slo.ttft_s:
            missed = f"TTFT target {slo.ttft_s * 1e3:.0f} ms (at least {ttft * 1e3:.0f} ms)"
        elif slo.deadline_s is not None:
            batch = len(inst.running) + 1
            ctx = sum(r.num_computed_tokens for r in inst.running) + req.prompt_tokens
            e2e = ttft + (out_len - 1) * cm.decode_time(batch, ctx) / self.scale
            if waited + e2e > slo.deadline_s:
                missed = f"deadline {slo.deadline_s:.3f} s (at least {e2e:.3f} s)"
        if missed:
            raise ServeError(
                f"the request's {missed} can no longer be met at {rep.name}",
                status=429,
                reason="deadline",
                retry_after_s=self.config.retry_after_s,
            )

    def generate(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        return _TokenStream(self, req)

    def _admit(self, req: GenerationRequest) -> tuple[_Replica, _Stream]:
        """Route and admit ``req`` (or raise :class:`ServeError`); the engine gets it now."""
        if self._loop is None:
            raise ServeError("the emulated backend is not started", reason="not_started")
        if self.stopping:
            raise ServeError("the server is shutting down", status=503, reason="shutdown")
        states = self.replicas()
        idx = self.router.pick(req, states)
        if idx is None:
            raise ServeError("no replica is healthy", status=503, reason="no_backend")
        rep = self._replicas[idx]
        mq = self.config.max_queue
        if mq is not None and len(rep.inst.waiting) >= mq:
            raise ServeError(
                f"queue full: {len(rep.inst.waiting)} requests waiting at {rep.name}",
                status=429,
                reason="queue_full",
                retry_after_s=self.config.retry_after_s,
            )
        out_len = self._output_len(req)
        if self.config.admission == "slo" and req.request_class is RequestClass.RT:
            self._admit_slo(rep, req, out_len)
        sim_arrival = max(rep.env.now, self.sim_now())
        r = Request(
            req_id=next(self._ids),
            arrival=sim_arrival,
            num_prompt_tokens=req.prompt_tokens,
            true_output_len=out_len,
            req_class=req.request_class,
            priority=req.priority,
            model=req.model,
            slo=req.slo,
            qoe=req.qoe,
            max_tokens=req.max_tokens,
        )
        stream = _Stream(r, req.request_id, req.max_tokens, req.prompt_tokens)
        rep.add(r, stream)
        return rep, stream

    def replicas(self) -> Sequence[ReplicaState]:
        return [rep.state() for rep in self._replicas]

    def models(self) -> Sequence[str]:
        return (self.model_name,)

    def max_context(self) -> int | None:
        return self.profile.model.max_context

    def check_params(self, body: dict[str, Any]) -> list[str]:
        stop = body.get("stop")
        return ["stop (the emulated backend streams filler text)"] if stop else []

    @property
    def healthy(self) -> bool:
        return self._loop is not None and not self.stopping

    # ---------------------------------------------------------------- introspection
    def instances(self) -> list[Instance]:
        """The replicas' engines (tests and benchmarks read their state)."""
        return [rep.inst for rep in self._replicas]

    def token_times(self, replica: int, req: Request) -> NDArray[np.float64]:
        """Event-loop (monotonic) times at which the engine emitted ``req``'s tokens: the
        ends of their iterations, mapped to wall time (when they were due, not when the
        loop got to them)."""
        ends = np.asarray(self._replicas[replica].inst.iter_end, dtype=np.float64)
        return self.t0 + ends[np.asarray(req.token_iterations(), dtype=np.int64)] / self.scale
