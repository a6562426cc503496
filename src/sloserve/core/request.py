"""The request, its state machine and its service-level targets.

Token accounting follows DESIGN.md: a request has ``num_prompt_tokens`` (never rewritten),
``num_output_tokens`` generated so far and ``num_computed_tokens`` held in the KV cache.
Prefill, chunked prefill and recompute ("refill") after an eviction are the same thing:
``num_computed_tokens`` catching up with ``seq_len = prompt + output``. An iteration that
brings ``num_computed_tokens`` up to ``seq_len`` emits one new token, so during decode
``num_computed_tokens == seq_len - 1`` and each decode step processes exactly one token.

Token emission times are kept compactly as runs of iteration indices of the instance that
served the request (``token_runs``); the instance's iteration log maps indices to times.

Failover (the cluster layer): when the replica holding a request fails, the request goes back
to WAITING (:meth:`Request.requeue_after_failure`) and is served again from scratch on
another replica. The tokens its client had already received are kept as absolute times in
``streamed_times``; the re-served request regenerates them without delivering them again, so
its client timeline is ``streamed_times`` followed by the new replica's tokens beyond them.

Disaggregated prefill/decode (the cluster layer): a prefill replica runs the prompt and
emits the first token, then the request leaves it (:meth:`Request.hand_off`): RUNNING ->
WAITING with ``num_computed_tokens == num_prompt_tokens`` and one output token, its client
timeline so far in ``streamed_times``. The KV of the prompt moves to a decode replica,
which admits it with those blocks allocated (no recompute) and runs decode steps of one
token each: the first decode step computes the first output token's KV and emits token 2.
``token_runs`` restarts as one placeholder token (iteration 0 of the decode replica) that
stands in for the tokens already streamed, so the decode replica's tokens line up behind
``streamed_times`` exactly as after a failover.
"""

from __future__ import annotations

import enum
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from sloserve.core.errors import InvalidTransition


class RequestStatus(enum.IntEnum):
    """Lifecycle states, ordered: terminal states compare greater than live ones."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED_RECOMPUTE = 2
    PREEMPTED_SWAPPED = 3
    FINISHED = 4
    ABORTED = 5
    REJECTED = 6

    @property
    def is_terminal(self) -> bool:
        return self >= RequestStatus.FINISHED


class RequestClass(str, enum.Enum):
    """A request's service class.

    ``rt``/``be``: real-time (latency SLOs) or best-effort (throughput only), as BROS
    distinguishes. ``critical``/``standard``/``sheddable``/``batch``: the cluster's
    criticality classes (the Gateway API Inference Extension's, plus batch): each carries
    its own SLO targets and priority (``workload.slo``), and admission's ``shed`` may
    reject only :attr:`sheddable` classes. BROS treats every class but ``be`` as real-time.
    """

    RT = "rt"
    BE = "be"
    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"
    BATCH = "batch"

    @property
    def sheddable(self) -> bool:
        """Admission may reject it under overload (``sheddable``, ``batch``, ``be``)."""
        return self in (RequestClass.SHEDDABLE, RequestClass.BATCH, RequestClass.BE)


@dataclass(frozen=True, slots=True)
class SLO:
    """Per-request latency targets in seconds; ``None`` means no target of that kind."""

    ttft_s: float | None = None
    """Time to first token."""
    tpot_s: float | None = None
    """Mean time per output token after the first."""
    deadline_s: float | None = None
    """End-to-end latency bound, arrival to last token (QLM's deadline)."""

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "deadline_s"):
            v = getattr(self, name)
            if v is not None and not 0 < v < math.inf:
                raise ValueError(f"SLO.{name} must be a finite time > 0, got {v}")

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.deadline_s is None


@dataclass(frozen=True, slots=True)
class QoESpec:
    """Andes' expected consumption timeline: first token after ``ttft_s``, then ``tokens_per_s``."""

    ttft_s: float
    tokens_per_s: float

    def __post_init__(self) -> None:
        if not 0 <= self.ttft_s < math.inf:
            raise ValueError(f"QoESpec.ttft_s must be a finite time >= 0, got {self.ttft_s}")
        if not 0 < self.tokens_per_s < math.inf:
            raise ValueError(
                f"QoESpec.tokens_per_s must be finite and > 0, got {self.tokens_per_s}"
            )


_LIVE_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED_RECOMPUTE)


@dataclass(slots=True, eq=False)
class Request:
    """One inference request and its mutable serving state.

    ``true_output_len`` is the number of tokens the request will generate. The engine uses
    it to decide when the request ends; policies must not read it and go through an
    :class:`~sloserve.core.predictor.OutputLengthPredictor` instead (``oracle`` reads it on
    purpose and says so).
    """

    req_id: int
    arrival: float
    num_prompt_tokens: int
    true_output_len: int
    req_class: RequestClass = RequestClass.RT
    priority: int = 0
    """Lower is served first (vLLM's convention)."""
    model: str = "default"
    slo: SLO = field(default_factory=SLO)
    qoe: QoESpec | None = None
    max_tokens: int | None = None
    """The client's cap on output tokens, if known (what a real engine would see)."""
    hash_ids: tuple[int, ...] | None = None
    """Ids of the prompt's 512-token blocks, from a Mooncake-style trace (equal ids: equal
    prefix blocks): the prompt's identity for prefix caching (``engine/prefix_cache.py``)."""
    session_id: int | None = None
    """The multi-turn session it belongs to, if any (generated sessions): session-affinity
    routing keeps a session on one replica."""
    num_cached_tokens: int = 0
    """Prompt tokens found in the prefix cache when it was last queued on a replica (its
    ``num_computed_tokens`` started there)."""

    status: RequestStatus = RequestStatus.WAITING
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    num_swaps: int = 0
    first_scheduled: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    status_time: float = 0.0
    reject_reason: str = ""
    token_runs: list[int] = field(default_factory=list)
    """Flattened inclusive ``[start, end]`` pairs of iteration indices that emitted a token."""
    instance_id: int = -1
    streamed_times: list[float] = field(default_factory=list)
    """Delivery times of the tokens the client received before a replica failure (empty
    unless the request failed over); they are not delivered twice."""
    num_failovers: int = 0
    transitions: list[tuple[float, int, int]] = field(default_factory=list)
    """Every state change as ``(time, new status, instance id)``: the request's timeline
    (queued, running, preempted, swapped, failed over) for traces such as Perfetto's."""

    def __post_init__(self) -> None:
        # numpy integers (a trace read with numpy) become ints: the compiled engine
        # (SLOSERVE_COMPILE=1) reads these fields as ints and rejects anything else.
        if type(self.req_id) is not int:
            self.req_id = operator.index(self.req_id)
        if type(self.num_prompt_tokens) is not int:
            self.num_prompt_tokens = operator.index(self.num_prompt_tokens)
        if type(self.true_output_len) is not int:
            self.true_output_len = operator.index(self.true_output_len)
        if type(self.priority) is not int:
            self.priority = operator.index(self.priority)
        if self.max_tokens is not None and type(self.max_tokens) is not int:
            self.max_tokens = operator.index(self.max_tokens)
        if self.num_prompt_tokens < 1:
            raise ValueError(f"request {self.req_id}: prompt must have >= 1 token")
        if self.true_output_len < 1:
            raise ValueError(f"request {self.req_id}: output must have >= 1 token")
        if self.arrival < 0:
            raise ValueError(f"request {self.req_id}: arrival must be >= 0")
        self.status_time = self.arrival

    # ----------------------------------------------------------------- derived counters
    @property
    def seq_len(self) -> int:
        """Prompt plus generated tokens: what a full (re)fill must compute."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def remaining_compute(self) -> int:
        """Tokens to process before the next token can be emitted (1 while decoding)."""
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens

    @property
    def in_decode(self) -> bool:
        """True when the next step is a one-token decode (not a prefill or refill)."""
        return self.num_output_tokens > 0 and self.remaining_compute == 1

    @property
    def remaining_output(self) -> int:
        """Tokens still to generate (engine-side knowledge; policies use a predictor)."""
        return self.true_output_len - self.num_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    # ----------------------------------------------------------------- transitions
    def _move(self, allowed: tuple[RequestStatus, ...], to: RequestStatus, now: float) -> None:
        if self.status not in allowed:
            names = "|".join(s.name for s in allowed)
            raise InvalidTransition(
                f"request {self.req_id}: cannot go {self.status.name} -> {to.name} "
                f"(allowed from {names})"
            )
        if now < self.status_time - 1e-9:
            raise InvalidTransition(
                f"request {self.req_id}: time went backwards ({now} < {self.status_time})"
            )
        self.status = to
        self.status_time = now
        self.transitions.append((now, int(to), self.instance_id))

    def start(self, now: float) -> None:
        """WAITING | PREEMPTED_RECOMPUTE -> RUNNING (admitted to the KV cache)."""
        self._move(_LIVE_QUEUED, RequestStatus.RUNNING, now)
        if self.first_scheduled is None:
            self.first_scheduled = now

    def preempt_recompute(self, now: float) -> None:
        """RUNNING -> PREEMPTED_RECOMPUTE: the KV cache is dropped and must be refilled."""
        self._move((RequestStatus.RUNNING,), RequestStatus.PREEMPTED_RECOMPUTE, now)
        self.num_computed_tokens = 0
        self.num_preemptions += 1

    def preempt_swap(self, now: float) -> None:
        """RUNNING -> PREEMPTED_SWAPPED: the KV cache moves to the CPU tier."""
        self._move((RequestStatus.RUNNING,), RequestStatus.PREEMPTED_SWAPPED, now)
        self.num_preemptions += 1
        self.num_swaps += 1

    def swap_in(self, now: float) -> None:
        """PREEMPTED_SWAPPED -> RUNNING: the KV cache is back on the GPU."""
        self._move((RequestStatus.PREEMPTED_SWAPPED,), RequestStatus.RUNNING, now)

    def finish(self, now: float) -> None:
        """RUNNING -> FINISHED, after its last token."""
        self._move((RequestStatus.RUNNING,), RequestStatus.FINISHED, now)
        self.finish_time = now

    def abort(self, now: float) -> None:
        """Any live state -> ABORTED (client went away, or the run ended first)."""
        self._move(
            (
                RequestStatus.WAITING,
                RequestStatus.RUNNING,
                RequestStatus.PREEMPTED_RECOMPUTE,
                RequestStatus.PREEMPTED_SWAPPED,
            ),
            RequestStatus.ABORTED,
            now,
        )
        self.finish_time = now

    def requeue_after_failure(self, now: float, streamed: list[float]) -> None:
        """Any live state -> WAITING: the replica holding it failed and its KV cache is lost.

        ``streamed`` is the client's timeline so far (delivery times of every token it
        received, earlier failovers included). The request restarts from scratch: no
        output, no KV, no replica; its arrival, first scheduling and first-token times stay.
        """
        self._move(
            (
                RequestStatus.WAITING,
                RequestStatus.RUNNING,
                RequestStatus.PREEMPTED_RECOMPUTE,
                RequestStatus.PREEMPTED_SWAPPED,
            ),
            RequestStatus.WAITING,
            now,
        )
        if len(streamed) > len(self.streamed_times):
            self.streamed_times = list(streamed)
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.token_runs = []
        self.instance_id = -1
        self.num_failovers += 1

    def hand_off(self, now: float, streamed: list[float]) -> None:
        """RUNNING -> WAITING: a prefill replica emitted the first token; the request leaves
        it with its prompt's KV (``num_computed_tokens`` unchanged), to be decoded on
        another replica (module docstring). ``streamed`` is the client timeline so far."""
        self._move((RequestStatus.RUNNING,), RequestStatus.WAITING, now)
        if len(streamed) > len(self.streamed_times):
            self.streamed_times = list(streamed)
        # One placeholder token per output token already emitted, so that the decode
        # replica's tokens are the ones beyond ``streamed_times`` (see token_times).
        n = self.num_output_tokens
        self.token_runs = [0, n - 1] if n else []
        self.instance_id = -1

    def reject(self, now: float, reason: str) -> None:
        """WAITING -> REJECTED: the request can never be served (e.g. longer than M)."""
        self._move((RequestStatus.WAITING,), RequestStatus.REJECTED, now)
        self.reject_reason = reason
        self.finish_time = now

    # ----------------------------------------------------------------- tokens
    def last_token_time(self, iter_end: Sequence[float]) -> float:
        """When the client last received a token (``iter_end``: the iteration log of the
        instance serving it; the request has emitted at least one token). While it has no
        token of its own here beyond those already streamed (handed off by a prefill
        replica, its runs a placeholder; re-served after a failover, regenerating tokens
        the client has) that is the last streamed one."""
        if self.num_output_tokens <= len(self.streamed_times):
            return self.streamed_times[-1]
        return iter_end[self.token_runs[-1]]

    def record_tokens(self, first_iter: int, count: int) -> None:
        """Record ``count`` tokens emitted by consecutive iterations starting at ``first_iter``."""
        runs = self.token_runs
        last = first_iter + count - 1
        if runs and runs[-1] == first_iter - 1:
            runs[-1] = last
        else:
            runs.append(first_iter)
            runs.append(last)
        self.num_output_tokens += count

    def token_iterations(self) -> list[int]:
        """Iteration index of every emitted token, in order."""
        out: list[int] = []
        runs = self.token_runs
        for i in range(0, len(runs), 2):
            out.extend(range(runs[i], runs[i + 1] + 1))
        return out
