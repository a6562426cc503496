"""The contract between an instance and its scheduling policy.

A policy sees an :class:`InstanceView` (read-only) and returns a :class:`SchedulerOutput`;
the instance validates it against the :class:`Limits` and the KV manager before applying
it, so a buggy policy raises :class:`~sloserve.core.errors.SchedulerViolation` instead of
corrupting the engine.

Extension point: subclass :class:`Scheduler` (see ``sloserve.policies`` for the built-ins).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from sloserve.core.errors import ConfigError
from sloserve.core.predictor import OutputLengthPredictor
from sloserve.core.request import Request
from sloserve.costmodel.base import CostModel

if TYPE_CHECKING:
    from sloserve.engine.kv import KVCacheManager


class PreemptionMode(str, enum.Enum):
    """How an evicted request's KV cache is handled."""

    RECOMPUTE = "recompute"
    """Drop the KV cache; the request later refills prompt + generated tokens."""
    SWAP = "swap"
    """Copy the KV cache to the CPU tier; swapping it back costs PCIe time."""

    @classmethod
    def parse(cls, value: object, policy: str) -> PreemptionMode:
        """``value`` as a mode (a policy parameter from a config), or a ConfigError naming
        the policy and the value."""
        try:
            return cls(value)
        except ValueError as e:
            raise ConfigError(
                f"policy {policy!r}: preemption_mode must be recompute or swap, got {value!r}"
            ) from e


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-iteration limits, in InferMax's notation."""

    max_batch_tokens: int
    """C: tokens processed in one iteration."""
    max_prefill_tokens: int
    """P: prefill (and refill) tokens in one iteration, P <= C."""
    kv_capacity_tokens: int
    """M: tokens of KV cache (block-rounded)."""
    max_running: int
    """R_max: requests holding KV cache at once."""
    block_size: int

    def __post_init__(self) -> None:
        for name in (
            "max_batch_tokens",
            "max_prefill_tokens",
            "kv_capacity_tokens",
            "max_running",
            "block_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_prefill_tokens > self.max_batch_tokens:
            raise ValueError("P (max_prefill_tokens) must be <= C (max_batch_tokens)")


class ScheduledRequest(NamedTuple):
    """One request in the next batch and the tokens it processes (1 for a decode step).

    A named tuple rather than a dataclass: policies build one per request per iteration.
    """

    request: Request
    num_tokens: int


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """What the next iteration does, in the order the instance applies it.

    1. ``preempt``: running requests to evict, each with its mode;
    2. ``swap_in``: swapped requests whose KV comes back to the GPU;
    3. ``batch``: the requests that run, with their token counts, in KV-allocation order.

    ``repeatable`` is the policy's promise that it would return the same batch again (the
    same requests; decodes one token each, prefills the same chunk) until: a request
    arrives, a request finishes or completes its prefill, or the decodes' KV growth no
    longer fits in the free blocks minus ``repeat_reserve_blocks`` (which the policy keeps
    for the prefill entries' later chunks). Every request in a repeatable batch must
    already be running. The instance then advances many iterations at once, with results
    identical to stepping one at a time. Leave it False when unsure.
    """

    batch: tuple[ScheduledRequest, ...] = ()
    preempt: tuple[tuple[Request, PreemptionMode], ...] = ()
    swap_in: tuple[Request, ...] = ()
    repeatable: bool = False
    repeat_reserve_blocks: int = 0

    def __post_init__(self) -> None:
        if self.repeat_reserve_blocks < 0:
            raise ValueError("repeat_reserve_blocks must be >= 0")
        # A policy may hand over lists: the engine keeps tuples (its own, never aliased to
        # a list the policy mutates later; and the compiled build's code reads tuples).
        if type(self.batch) is not tuple:
            object.__setattr__(self, "batch", tuple(self.batch))
        if type(self.swap_in) is not tuple:
            object.__setattr__(self, "swap_in", tuple(self.swap_in))
        preempt = self.preempt
        if type(preempt) is not tuple or (preempt and any(type(p) is not tuple for p in preempt)):
            object.__setattr__(self, "preempt", tuple(tuple(p) for p in preempt))

    @property
    def empty(self) -> bool:
        return not self.batch and not self.preempt and not self.swap_in


EMPTY_OUTPUT = SchedulerOutput()

_new = object.__new__
_set_batch, _set_preempt, _set_swap_in, _set_repeatable, _set_reserve = (
    SchedulerOutput.__dict__[f].__set__  # the slots' own descriptors (frozen)
    for f in ("batch", "preempt", "swap_in", "repeatable", "repeat_reserve_blocks")
)


def scheduler_output(
    batch: tuple[ScheduledRequest, ...],
    preempt: tuple[tuple[Request, PreemptionMode], ...],
    swap_in: tuple[Request, ...],
    repeatable: bool,
    repeat_reserve_blocks: int,
) -> SchedulerOutput:
    """``SchedulerOutput(...)`` by position, equal in every way, at half the cost (a
    policy builds one per decision; a frozen dataclass sets each field through
    ``object.__setattr__``)."""
    if repeat_reserve_blocks < 0:
        raise ValueError("repeat_reserve_blocks must be >= 0")
    out = _new(SchedulerOutput)
    _set_batch(out, batch)
    _set_preempt(out, preempt)
    _set_swap_in(out, swap_in)
    _set_repeatable(out, repeatable)
    _set_reserve(out, repeat_reserve_blocks)
    return out


class InstanceView:
    """Read-only window on an instance for its policy.

    The queues are the instance's own lists (not copies, for speed): policies must not
    mutate them. ``waiting`` holds new and recompute-preempted requests in arrival order;
    ``running`` holds requests with KV on the GPU, in arrival order; ``swapped`` holds
    requests whose KV is on the CPU tier, in arrival order.

    With prefix caching (``engine/prefix_cache.py``) a waiting request may already hold
    the cached prefix of its prompt: its ``num_computed_tokens`` starts there (and
    ``num_cached_tokens`` says how much was found), so ``remaining_compute`` and
    ``kv.blocks_needed`` count only what is left to prefill — a policy that budgets those
    accounts cached tokens correctly without knowing about the cache.

    ``iter_end`` is the instance's iteration log (the end time of every iteration so far,
    the instance's own list): ``Request.token_runs`` index into it, so a policy can read
    when each token was delivered (Andes' QoE estimate needs that). Read only.

    ``filling`` (None when unknown) holds every running request that may be part-way
    through a (re)fill: the engine adds each request that joins ``running`` needing one
    and drops it once it has seen it decoding or gone, so it is a small superset. A
    policy that looks for the running requests still filling can walk it instead of
    all of ``running``, re-testing each (status RUNNING on this instance, tokens left).
    """

    __slots__ = (
        "cost_model",
        "filling",
        "instance_id",
        "iter_end",
        "kv",
        "limits",
        "now",
        "predictor",
        "running",
        "swapped",
        "waiting",
    )

    def __init__(
        self,
        *,
        instance_id: int,
        waiting: Sequence[Request],
        running: Sequence[Request],
        swapped: Sequence[Request],
        kv: KVCacheManager,
        cost_model: CostModel,
        predictor: OutputLengthPredictor,
        limits: Limits,
        iter_end: Sequence[float] = (),
        filling: Collection[Request] | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.now = 0.0
        self.waiting = waiting
        self.running = running
        self.swapped = swapped
        self.kv = kv
        self.cost_model = cost_model
        self.predictor = predictor
        self.limits = limits
        self.iter_end = iter_end
        self.filling = filling


class Scheduler(ABC):
    """A per-instance scheduling policy.

    Subclasses set ``name`` and implement :meth:`schedule`. They may keep state between
    calls (e.g. an adaptive batch size); the instance calls :meth:`on_finish` when a request
    completes so that state can be updated.
    """

    name: str = "scheduler"

    @abstractmethod
    def schedule(self, view: InstanceView) -> SchedulerOutput:
        """Choose the next iteration's batch, evictions and swap-ins."""

    default_prefill_tokens: int | None = None
    """The policy's own P when the user sets none (Sarathi: 512); None means P = C."""
    chunked_prefill: bool = True
    """Whether the policy splits prompts over iterations (then a user's chunk size is P)."""

    def max_sequence_tokens(self, limits: Limits) -> int:
        """Longest prompt+output the policy can ever serve; longer requests are rejected
        on arrival instead of waiting forever."""
        return limits.kv_capacity_tokens

    repeats_final_chunk: bool = False
    """The policy's promise, beyond ``repeatable``, for a repeatable batch holding exactly
    one non-final prefill chunk (``(r, n)``, ``n`` < what ``r`` has left): when ``r``'s
    prompt reaches its final chunk (the ``m`` = (left - 1) // n iterations later that
    ``repeatable`` already covers) and meanwhile nothing arrived, nothing waits, nothing is
    swapped out, no request finished and the decodes' growth for one more iteration still
    fits in the free blocks minus ``repeat_reserve_blocks`` (which must cover the whole
    rest of ``r``'s prompt), the policy returns the same batch, the same entries in the
    same order, with ``r`` taking the rest of its prompt. The instance then runs that
    final chunk as the last iteration of the run (:mod:`~sloserve.engine.chunk_run`),
    priced and recorded as a single step would be. Leave it False when unsure."""

    repeats_joined_chunk: bool = False
    """A further promise (with :attr:`repeats_final_chunk`): when a batch admits exactly one
    waiting request that has generated nothing (its computed tokens, if any, a prefix found
    in the prefix cache), with a non-final chunk of ``n``
    tokens, and every other entry is a one-token decode of a running request (all of
    them), then while nothing arrives, waits, is swapped out or finishes and the decodes'
    growth fits (the prompt's rest kept free), the next batch is the same entries with
    that request running and taking ``n`` tokens again (a middle chunk, repeatable, its
    reserve the blocks of the prompt's rest) or its rest (the final chunk). The instance
    then runs the prompt from its joining chunk to its final one at once
    (:mod:`~sloserve.engine.chunk_run`). Leave it False when unsure."""

    repeats_decode_run: bool = False
    """The policy's promise for a decision after a repeatable batch of one-token decodes
    of running requests (a run of them or a single step, cut short or ended because one
    of them finished): when the running
    requests are exactly that batch's requests minus those that finished or left (every
    one a one-token decode), nothing waits, nothing is swapped out or still to be
    admitted, and each of them fits whatever block it needs (as many free blocks as
    running requests, and no more of them than C), the policy returns that batch again:
    the same entries in the same order without the departed ones, repeatable, with no
    reserve, no eviction and no swap-in. The instance then takes that answer without
    calling :meth:`schedule` (:mod:`~sloserve.engine.decode_run`), so a policy that keeps
    state across calls, or whose answer depends on anything else (the clock, a
    predictor), must leave it False. Leave it False when unsure. Unlike the fast path it
    holds with ``multi_step=False`` too (it changes no result); set it False on the
    instance to have the policy asked at every decision (timing the policy itself)."""

    overlap_swap: bool = False
    """Whether KV transfers overlap the forward pass: the engine then charges an iteration
    ``max(batch_time, swap_time)`` instead of their sum (BROS §4.1: asynchronous swaps)."""

    def make_kv(self, limits: Limits, cpu_swap_blocks: int) -> KVCacheManager | None:
        """The KV manager this policy needs, built when the instance is given none; None
        (the default) means the ordinary paged manager. BROS returns its bidirectional
        blocks here, so that whoever builds instances need not know about them."""
        return None

    def on_finish(self, req: Request, now: float) -> None:  # noqa: B027 - optional hook
        """Called after a request of this instance finishes."""

    def describe(self) -> dict[str, object]:
        """The policy's parameters, for run summaries."""
        return {"name": self.name}
