"""Iteration-level round-robin between real-time and best-effort requests (BROS §2.2, the
``RR`` baseline of §7).

"The system maintains two FCFS queues for RT and BE requests, respectively, and serves them
in an interleaving manner at the iteration level." BROS's evaluation builds RR by replacing
BROS's scheduler with this and removing the bidirectional KV blocks, so RR runs on the
ordinary paged KV cache.

Our reading (choices the paper leaves open, all parameters of :class:`RRConfig`):

* **Turns.** Iterations alternate between the RT and the BE class. In its turn a class is
  scheduled exactly as vLLM schedules (``base``: a preset of
  :class:`~sloserve.policies.infermax.unified.UnifiedScheduler`, ``vllm`` by default) on a
  view that holds only that class's requests; the other class's requests keep their KV cache but do
  not run. When the class whose turn it is has nothing to run, the other class runs in its
  place (work conserving) and the turn still passes; when neither can run on its own
  (one class's request cannot grow while the other holds the memory), one vLLM decision
  over both classes runs instead.
* **Memory.** A class never evicts the other class's requests (victims come from the class
  whose turn it is, vLLM's rule); requests without a class of their own are RT (the
  default of :class:`~sloserve.core.request.Request`).
* While only one class has live requests RR is plain vLLM, and keeps vLLM's repeatable
  batches (the simulator's fast path) until a request of the other class arrives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.core.request import Request, RequestClass
from sloserve.engine.interface import (
    InstanceView,
    Limits,
    PreemptionMode,
    Scheduler,
    SchedulerOutput,
)
from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler

_RT, _BE = RequestClass.RT, RequestClass.BE


@dataclass(frozen=True)
class RRConfig:
    """Parameters of the round-robin baseline."""

    base: str = "vllm"
    """Per-class batching within a turn: ``vllm`` (prefill priority, no hybrid batches, no
    chunking; BROS's RR is built on its own vLLM-like engine) or ``sarathi`` (decode
    priority, hybrid batches, chunked prefill)."""
    first: RequestClass = RequestClass.RT
    """The class whose turn comes first."""


_BASES: dict[str, UnifiedConfig] = {
    "vllm": UnifiedConfig("prefill-first", hybrid=False, chunked_prefill=False),
    "sarathi": UnifiedConfig("decode-first", hybrid=True, chunked_prefill=True, prefill_tokens=512),
}


def _of(reqs: Any, cls: RequestClass) -> list[Request]:
    return [r for r in reqs if r.req_class is cls]


class RoundRobinScheduler(Scheduler):
    """Alternate RT and BE iterations, each scheduled FCFS as vLLM would."""

    def __init__(
        self,
        config: RRConfig | None = None,
        name: str = "rr",
        base_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config or RRConfig()
        if self.config.base not in _BASES:
            raise ConfigError(
                f"policy {name!r}: base must be one of {', '.join(_BASES)}, "
                f"got {self.config.base!r}"
            )
        self.name = name
        base = dataclasses.replace(_BASES[self.config.base], **(base_overrides or {}))
        self.inner = UnifiedScheduler(name, base)
        self.default_prefill_tokens = self.inner.default_prefill_tokens
        self.chunked_prefill = self.inner.chunked_prefill
        self.turn = self.config.first

    def max_sequence_tokens(self, limits: Limits) -> int:
        return self.inner.max_sequence_tokens(limits)

    def describe(self) -> dict[str, object]:
        d = self.inner.describe()
        d.update(name=self.name, base=self.config.base, first=self.config.first.value)
        return d

    def _class_view(self, view: InstanceView, cls: RequestClass) -> InstanceView:
        running = _of(view.running, cls)
        # The other class's running requests hold R_max slots too.
        room = view.limits.max_running - (len(view.running) - len(running))
        limits = view.limits
        waiting, swapped = _of(view.waiting, cls), _of(view.swapped, cls)
        if room < 1:
            waiting, swapped = [], []  # nobody can join (and Limits needs R_max >= 1)
        elif room != limits.max_running:
            limits = dataclasses.replace(limits, max_running=room)
        sub = InstanceView(
            instance_id=view.instance_id,
            waiting=waiting,
            running=running,
            swapped=swapped,
            kv=view.kv,
            cost_model=view.cost_model,
            predictor=view.predictor,
            limits=limits,
            iter_end=view.iter_end,
        )
        sub.now = view.now
        return sub

    def schedule(self, view: InstanceView) -> SchedulerOutput:
        live = {
            c: any(r.req_class is c for q in (view.waiting, view.running, view.swapped) for r in q)
            for c in (_RT, _BE)
        }
        if not (live[_RT] and live[_BE]):
            # One class only: plain vLLM, including its repeatable (fast-path) batches; a
            # request of the other class is an arrival, which ends any repeated run.
            return self.inner.schedule(view)
        turn = self.turn
        other = _BE if turn is _RT else _RT
        self.turn = other
        out = self.inner.schedule(self._class_view(view, turn))
        if not out.batch:
            out = self.inner.schedule(self._class_view(view, other))
        if not out.batch:
            # Neither class can run on its own (e.g. a request cannot grow while the other
            # class holds the memory): one vLLM decision over both classes, which may
            # evict across classes, so that the replica never stalls.
            out = self.inner.schedule(view)
        # The next iteration belongs to the other class: never repeat this one.
        return dataclasses.replace(out, repeatable=False, repeat_reserve_blocks=0)


def make_rr(params: Mapping[str, Any]) -> Scheduler:
    """The registry factory: ``params`` override :class:`RRConfig` fields, and fields of
    :class:`~sloserve.policies.infermax.unified.UnifiedConfig` (``watermark``, ``order``,
    ``preemption_mode``, ...) override the per-class ``base`` preset."""
    fields = {f.name for f in dataclasses.fields(RRConfig)}
    unified = {f.name for f in dataclasses.fields(UnifiedConfig)}
    unknown = sorted(set(params) - fields - unified)
    if unknown:
        raise ConfigError(
            f"policy 'rr': unknown parameter(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(fields | unified))}"
        )
    p = {k: v for k, v in params.items() if k in fields}
    base = {k: v for k, v in params.items() if k in unified}
    if "preemption_mode" in base:
        base["preemption_mode"] = PreemptionMode.parse(base["preemption_mode"], "rr")
    if "first" in p:
        try:
            p["first"] = RequestClass(p["first"])
        except ValueError as e:
            raise ConfigError(f"policy 'rr': first must be rt or be, got {p['first']!r}") from e
    try:
        return RoundRobinScheduler(RRConfig(**p), base_overrides=base)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"policy 'rr': {e}") from e
