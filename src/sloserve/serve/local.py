"""The local backend: a real model behind the gateway (``sloserve serve --backend local``).

One replica of the engine whose executor is execute mode's
:class:`~sloserve.engine.execute.TorchExecutor` (a local Llama checkpoint, or random
weights of a ``--model-spec``), stepped in wall-clock time. Everything else is the
emulated backend's (:class:`~sloserve.serve.emulated.EmulatedBackend`, which this class
extends): the policy and its KV manager, admission (``max_queue``, ``slo``), the metrics,
a client disconnect aborting the request and freeing its KV blocks, an engine error ending
that replica's streams with a 500 and restarting it. What this module adds:

* **Real tokens.** The prompt is tokenised by the checkpoint's tokenizer (or hashed to
  deterministic ids without one), :mod:`sloserve.serve.local_text`; its real length is the
  engine's prompt and the usage the client sees. Each generated id is detokenised
  incrementally (one :class:`~sloserve.serve.backend.TokenChunk` per token, its text what
  the token adds; an incomplete UTF-8 character waits for its last byte). The
  checkpoint's end-of-sequence token ends a request with ``stop`` (``ignore_eos: true``
  keeps it going); ``max_tokens`` ends it with ``length``.
* **Context.** A prompt that leaves no room in the model's context is a 400
  ``context_length_exceeded``; so is an explicit ``max_tokens`` beyond the room left. A
  default ``max_tokens`` is cut to the room (the gateway's estimate of the prompt is not
  the tokenizer's count).
* **Sampling** is the server's: greedy, or ``temperature`` > 0 seeded per request and
  position. A request's own sampling parameters are not applied (as in the emulated
  backend); ``min_tokens`` (with an EOS) is refused with a 400. ``stop`` strings end a
  stream with ``stop`` (:class:`~sloserve.serve.local_text.StopMatcher`); the request is
  then released, which aborts it in the engine and frees its KV.

**Why a worker thread.** A forward pass takes milliseconds to seconds; run on the event
loop it would stall every other stream and every new connection for that long. So engine
steps (policy, KV bookkeeping, the forward pass) run in one worker thread, one step at a
time, and the loop keeps streaming, parsing and answering ``/metrics`` meanwhile. The
engine is never touched by two threads at once: while a step runs, the loop does not
mutate it (a new request's admission awaits the step's end, a disconnect's abort is
applied when it ends, ``/metrics`` reads the replica state of the last idle moment), and
before each forward pass the worker hands the loop the tokens of the iteration that just
ended and waits until they are queued on their streams (the loop then reads the engine
while the worker waits), so a token reaches its client while the next iteration computes,
not after it. Stepping between awaits on the loop instead would delay every other
request's bytes by a full iteration each time and hold new connections behind it.

The engine's clock is wall time since :meth:`start` (``time_scale`` 1): an iteration lasts
its wall time, the forward pass (what the measured-vs-predicted records keep) plus the
gateway's share (the hand-off, the policy's decision), so each worker step is one
iteration. A request arriving during a step is admitted when the step ends, at the
engine's clock then; the engine could not have scheduled it earlier.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sloserve.cluster.replica import ReplicaSpec
from sloserve.core.errors import ConfigError
from sloserve.costmodel.base import CostModel
from sloserve.engine.execute import LoadedModel, TorchExecutor
from sloserve.engine.executor import ExecBatch
from sloserve.engine.instance import Instance
from sloserve.experiments.execute_run import kv_tokens_for
from sloserve.experiments.runner import SimConfig, build_instance
from sloserve.serve.backend import (
    FinishReason,
    GenerationRequest,
    ReplicaState,
    ServeError,
    TokenChunk,
)
from sloserve.serve.emulated import EmulatedBackend
from sloserve.serve.emulated_config import EmulatedConfig
from sloserve.serve.emulated_stream import _Stream
from sloserve.serve.local_text import IncrementalDetokenizer, PromptEncoder, StopMatcher


class _GatewayExecutor(TorchExecutor):
    """The torch executor, handing the loop the finished iteration's tokens before each
    forward pass, ending each iteration at the wall clock's now, and not stopping at EOS
    the requests that asked ``ignore_eos``."""

    def __init__(
        self, backend: LocalBackend, loaded: LoadedModel, cost_model: CostModel, **kw: Any
    ) -> None:
        super().__init__(loaded, cost_model, **kw)
        self.backend = backend
        self.ignore_eos: set[int] = set()

    def run(self, batch: ExecBatch) -> float:
        be = self.backend
        # An executor changes no engine state: readers (/metrics) may look meanwhile.
        be._engine_lock.release()
        try:
            be._handoff()
            measured = super().run(batch)  # what the records and the report keep
        finally:
            be._engine_lock.acquire()
        # The engine's clock is the wall's: the iteration ends now, the hand-off and the
        # policy's decision included. Counting the forward pass alone would let the clock
        # fall behind the wall a little every iteration, until one worker step ran many
        # iterations and kept new requests out for all of them.
        return max(measured, be.sim_now() - be.env.now)

    def take_stops(self) -> set[int]:
        return super().take_stops() - self.ignore_eos


class LocalBackend(EmulatedBackend):
    """A real model behind the gateway (module docstring). ``config``: the emulated
    backend's, for one replica in real time (its ``instance.profile`` gives the policy its
    cost model; the KV capacity is what fits the device, as in execute mode);
    ``loaded``: from :func:`~sloserve.engine.execute.load_model`."""

    name = "local"

    def __init__(
        self, config: EmulatedConfig, loaded: LoadedModel, *, temperature: float = 0.0
    ) -> None:
        if config.cluster_config().num_replicas != 1:
            raise ConfigError("--replicas: the local backend runs one replica on one device")
        if config.time_scale != 1:
            raise ConfigError(
                f"--time-scale {config.time_scale}: the local backend runs in real time"
            )
        if config.output_length is not None:
            raise ConfigError("--output-length: the local model ends its outputs (EOS, max_tokens)")
        if not 0 <= temperature <= 100:
            raise ConfigError(f"--temperature must be in [0, 100], got {temperature}")
        kv = kv_tokens_for(loaded, SimConfig(instance=config.instance))
        instance = config.instance.model_copy(update={"kv_capacity_tokens": kv})
        name = config.served_model_name or loaded.name
        super().__init__(
            config.model_copy(update={"instance": instance, "served_model_name": name})
        )
        self.loaded = loaded
        self.temperature = temperature
        self.encoder = PromptEncoder(
            loaded.tokenizer, loaded.model.spec.vocab_size, loaded.chat_template,
            loaded.special_tokens,
        )  # fmt: skip
        self.executor: _GatewayExecutor | None = None
        """The executor of the replica's current engine (a new one after a restart)."""
        dev = loaded.model.device
        # a new thread's current CUDA device is 0: the executor's synchronize must wait
        # for the model's device
        init = None
        if dev.type == "cuda" and dev.index is not None:
            init = functools.partial(loaded.model.torch.cuda.set_device, dev)
        self._pool = ThreadPoolExecutor(1, "sloserve-engine", initializer=init)
        self._engine_lock = threading.Lock()
        """Held by the worker while a step changes the engine (not during the hand-off or
        the forward pass): what :meth:`engine_read` waits for."""
        self._stepping = False
        self._launching = False
        self._closed = False
        self._idle: asyncio.Event | None = None
        self._deferred: list[_Stream] = []
        """Streams released while a step ran: their aborts wait for its end."""
        self._detok: dict[int, IncrementalDetokenizer] = {}
        self._stop: dict[int, StopMatcher] = {}
        self._states: list[ReplicaState] = []
        self._queued = 0

    # ---------------------------------------------------------------- the engine
    def _make_instance(self, spec: ReplicaSpec, instance_id: int) -> Instance:
        inst = build_instance(self._group_cfgs[spec.group], self.env, instance_id=instance_id)
        ex = _GatewayExecutor(
            self, self.loaded, inst.cost_model, temperature=self.temperature,
            seed=self.config.seed,
        )  # fmt: skip
        inst.executor = ex  # a fresh engine (a restart included) starts a fresh cache
        self.executor = ex
        return inst

    def _ex(self) -> _GatewayExecutor:
        if self.executor is None:
            raise ServeError("the local backend is not started", reason="not_started")
        return self.executor

    async def start(self) -> None:
        self._idle = asyncio.Event()
        self._idle.set()
        await super().start()

    def kick(self) -> None:
        """Bring the clock to now; when events are due, step them in the worker thread
        (soon, never inside the caller: admission adds its request first)."""
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None
        self.timer_at = math.inf
        if self._stepping or self._closed:
            return  # the step's end re-arms the timer
        now = self.sim_now() + self.eps
        if self.env.peek() > now:
            self.env.run(until=now)  # nothing due: only the clock moves
            if self._ended:
                self._emit()
            self._arm()
        elif not self._launching:
            self._launching = True
            self.loop.call_soon(self._launch)

    def _launch(self) -> None:
        self._launching = False
        if self._stepping or self._closed:
            return
        now = self.sim_now() + self.eps
        if self.env.peek() > now:
            self.kick()
            return
        assert self._idle is not None
        self._stepping = True
        self._idle.clear()
        fut = self.loop.run_in_executor(self._pool, self._step, now)
        fut.add_done_callback(self._stepped)

    def _step(self, until: float) -> None:
        """Worker thread: every event due by ``until`` (an iteration's end, the next
        iteration's schedule and forward pass), then the clock to ``until``."""
        env = self.env
        with self._engine_lock:
            while env.peek() <= until:
                env.step()
            env.run(until=until)

    def _handoff(self) -> None:
        """Worker thread, before a forward pass: the loop queues the tokens of the
        iteration that just ended on their streams while this thread waits."""
        done = threading.Event()

        def emit() -> None:
            try:
                self._emit()
            finally:
                done.set()

        loop = self.loop
        try:
            loop.call_soon_threadsafe(emit)
        except RuntimeError:  # the loop is closed: nobody is left to stream to
            return
        while not done.wait(0.5):
            if not loop.is_running():
                return

    def _stepped(self, fut: asyncio.Future[None]) -> None:
        """The loop, when a step ended: stream its tokens, apply what waited for it."""
        self._stepping = False
        err = None if fut.cancelled() else fut.exception()
        self._emit()
        if err is not None:  # a policy that stalls or breaks a limit, or a bug
            self._engine_failed(err if isinstance(err, Exception) else RuntimeError(repr(err)))
        deferred, self._deferred = self._deferred, []
        for s in deferred:
            self.release(s)
        self._snapshot()
        assert self._idle is not None
        self._idle.set()
        self._arm()

    async def _quiesce(self) -> None:
        self._closed = True
        while self._stepping:
            assert self._idle is not None
            await self._idle.wait()

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        await super().stop(drain_timeout_s)
        self._pool.shutdown(wait=False)

    # ---------------------------------------------------------------- requests
    async def admit(self, req: GenerationRequest) -> _Stream:
        if self._loop is None or self._idle is None:
            raise ServeError("the local backend is not started", reason="not_started")
        ids = self.encoder.encode(req.endpoint, req.body)
        ctx = self.max_context()
        room = ctx - len(ids)
        asked = "max_tokens" in req.body or "max_completion_tokens" in req.body
        if room < 1 or (asked and req.max_tokens > room):
            raise ServeError(
                f"this model's maximum context length is {ctx} tokens; the prompt has "
                f"{len(ids)} tokens and asks for {req.max_tokens if asked else 'at least 1'} "
                "more",
                status=400,
                reason="context_length_exceeded",
            )
        req = dataclasses.replace(req, prompt_tokens=len(ids), max_tokens=min(req.max_tokens, room))
        while self._stepping:  # the engine is the worker's until its step ends
            await self._idle.wait()
        stream = self._admit(req)
        rid = stream.req.req_id
        ex = self._ex()
        ex.set_prompt(rid, ids)  # before the step that prefills it (launched after this)
        if req.body.get("ignore_eos"):
            ex.ignore_eos.add(rid)
        self._detok[rid] = IncrementalDetokenizer(self.loaded.tokenizer, ids)
        stop = req.body.get("stop")
        if stop:
            self._stop[rid] = StopMatcher([stop] if isinstance(stop, str) else stop)
        return stream

    def release(self, stream: _Stream) -> None:
        if self._stepping:
            self._deferred.append(stream)
            return
        super().release(stream)

    def _emit(self) -> None:
        ended = [r.req_id for r in self._ended]
        super()._emit()
        ex = self.executor
        for rid in ended:  # done with their ids and text
            self._detok.pop(rid, None)
            self._stop.pop(rid, None)
            if ex is not None:
                ex.forget(rid)
                ex.ignore_eos.discard(rid)

    def _push_tokens(self, s: _Stream, upto: int, finish: FinishReason | None) -> None:
        if s.finish:  # ended by a stop string: the engine's abort follows its release
            return
        rid = s.req.req_id
        ids = self._ex().tokens(rid)
        detok = self._detok.get(rid) or IncrementalDetokenizer(None, ())
        stop = self._stop.get(rid)
        eos = self.loaded.eos_id
        if finish == "length" and eos is not None and upto and ids[upto - 1] == eos:
            finish = "stop"  # EOS as the last allowed token: the model stopped
        put = s.items.append
        for i in range(s.sent, upto):
            last = finish is not None and i == upto - 1
            text = detok.add(ids[i], last=last)
            if stop is not None:
                text, hit = stop.feed(text, last=last)
                if hit:
                    put(TokenChunk(text, 1, "stop", s.prompt_tokens))
                    s.finish = True
                    break
            put(TokenChunk(text, 1, finish, s.prompt_tokens) if last else TokenChunk(text, 1))
        if finish is not None and upto > s.sent:
            s.finish = True
        s.sent = upto
        s.wake()

    # ---------------------------------------------------------------- state
    def engine_read(self) -> threading.Lock:
        return self._engine_lock

    def _snapshot(self) -> None:
        self._states = list(super().replicas())
        self._queued = super().queue_size

    def replicas(self) -> Sequence[ReplicaState]:
        if not self._stepping:  # else the worker owns the engine: the last idle view
            self._snapshot()
        return self._states

    @property
    def queue_size(self) -> int:
        if not self._stepping:
            self._snapshot()
        return self._queued

    def max_context(self) -> int:
        profile = super().max_context()
        model = self.loaded.model.spec.max_context
        return model if profile is None else min(profile, model)

    def check_params(self, body: dict[str, Any]) -> list[str]:
        bad = []
        if body.get("min_tokens") and self.loaded.eos_id is not None:
            bad.append("min_tokens (the local backend does not hold back the model's EOS)")
        return bad
