"""Generated prompt identity: shared system prompts per tenant, multi-turn sessions.

Two workload fields (generated workloads only; a replayed trace brings its own
``hash_ids``)::

    prefix: {system_prompt_tokens: 1500, tenants: 20}
    sessions: {turns: {mean: 6}, think_time_s: 20}

**Prefix.** Each session (each request, without ``sessions``) belongs to a tenant drawn
uniformly from ``tenants``; its prompt starts with that tenant's system prompt of
``system_prompt_tokens`` tokens, followed by the request's own message (its length drawn
as the workload's prompt lengths). The prompt's identity (:attr:`Request.hash_ids`, one
id per 512-token block, as Mooncake's traces give it) has the tenant's ids for the blocks
that lie wholly inside the system prompt and the session's own ids for the rest: tenants
share exactly their system prompt's full blocks.

**Sessions** (a closed loop per session; agent loops are sessions with a short think time
and many turns). The workload's arrival process gives each session's *first* turn. Each
later turn arrives ``think_time_s`` (exponential with that mean, or ``fixed``) after the
previous turn *finished*; its prompt is the previous prompt + the previous answer + a new
message (``message`` lengths, by default the workload's prompt lengths), so its block ids
extend the previous turn's (a block keeps its id across turns: the prompt up to the
previous one's end is the same text). The number of turns is geometric with mean
``turns.mean`` (or ``fixed``), at most ``turns.max``. A session ends early when a turn is
not served to completion (aborted, rejected: its user gave up) or when its next turn would
not fit ``max_context`` (the workload's, else the model's context window).

Everything random is drawn when the workload is built, from its own generator (the 9th
child of the workload's seed: the other components' draws are unchanged); only a later
turn's arrival time depends on the run. Request ids: first turns ``0..n-1`` by arrival,
later turns numbered after them by (session, turn), so a run is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloserve.core.bounds import MAX_TOKENS, Time, Tokens
from sloserve.core.request import QoESpec, Request
from sloserve.workloads.lengths import LengthDist
from sloserve.workloads.mixes import get_mix

if TYPE_CHECKING:
    from sloserve.workloads.spec import Workload, WorkloadSpec

BLOCK_TOKENS = 512
"""Tokens per identity block (Mooncake's ``hash_ids`` grain)."""
_SESSION_STRIDE = MAX_TOKENS // BLOCK_TOKENS + 1  # block ids one session may use


class PrefixSpec(BaseModel):
    """Shared system prompts: ``tenants`` of them, ``system_prompt_tokens`` long."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    system_prompt_tokens: Tokens
    tenants: int = Field(ge=1, le=1_000_000)


class TurnCount(BaseModel):
    """Turns per session: geometric with mean ``mean`` (>= 1), or exactly ``mean``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mean: float = Field(ge=1, le=10_000, allow_inf_nan=False)
    dist: Literal["geometric", "fixed"] = "geometric"
    max: int = Field(default=1_000, ge=1, le=100_000)

    @model_validator(mode="after")
    def _whole(self) -> TurnCount:
        if self.dist == "fixed" and self.mean != int(self.mean):
            raise ValueError(f"turns.mean must be a whole number when fixed ({self.mean})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        if self.dist == "fixed":
            t = np.full(n, int(self.mean), dtype=np.int64)
        else:
            t = rng.geometric(1.0 / self.mean, size=n).astype(np.int64)
        return np.minimum(t, self.max)


class SessionSpec(BaseModel):
    """Multi-turn sessions, a closed loop each (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turns: TurnCount
    think_time_s: Time = 10.0
    think_time_dist: Literal["exponential", "fixed"] = "exponential"
    message: LengthDist | None = Field(
        default=None, description="new message per later turn; default: the prompt lengths"
    )


def check_spec(spec: WorkloadSpec) -> None:
    """The combinations the generators do not support (raised as a validation error)."""
    if spec.prefix is None and spec.sessions is None:
        return
    if spec.uses_trace:
        raise ValueError("prefix/sessions generate prompts: not with a trace (it has hash_ids)")
    if spec.sessions is not None and spec.batch_jobs is not None:
        raise ValueError("sessions and batch_jobs are both closed loops: use one of them")


@dataclass(frozen=True, slots=True)
class Turn:
    """A later turn of a session, drawn in advance; it arrives when the one before ends."""

    req_id: int
    prompt_tokens: int
    output_tokens: int
    think_s: float


@dataclass
class SessionPlan:
    """The later turns of every session, keyed by the id of the turn before each."""

    after: dict[int, Turn] = field(default_factory=dict)
    ids_of: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Session -> (tenant or -1, system-prompt blocks shared with the tenant)."""
    session_base: int = 0
    ttft: dict[int, float] = field(default_factory=dict)
    """Andes TTFT target per later turn (by its id)."""

    def next_request(self, prev: Request, now: float) -> Request | None:
        """The turn after ``prev`` (which just ended at ``now``), or None: no more turns,
        or ``prev`` was not served to completion (its user gave up)."""
        turn = self.after.get(prev.req_id)
        if turn is None or not prev.is_finished:
            return None
        s = prev.session_id
        assert s is not None
        return Request(
            req_id=turn.req_id,
            arrival=now + turn.think_s,
            num_prompt_tokens=turn.prompt_tokens,
            true_output_len=turn.output_tokens,
            req_class=prev.req_class,
            priority=prev.priority,
            model=prev.model,
            slo=prev.slo,
            qoe=None
            if prev.qoe is None
            else QoESpec(self.ttft[turn.req_id], prev.qoe.tokens_per_s),
            max_tokens=prev.max_tokens,
            hash_ids=self.block_ids(s, turn.prompt_tokens),
            session_id=s,
        )

    def block_ids(self, session: int, prompt_tokens: int) -> tuple[int, ...]:
        """Identity blocks of a prompt of ``session`` (module docstring)."""
        tenant, shared = self.ids_of[session]
        n = -(-prompt_tokens // BLOCK_TOKENS)
        k = min(n, shared)
        own = self.session_base + session * _SESSION_STRIDE
        return tuple(tenant * shared + i for i in range(k)) + tuple(own + i for i in range(k, n))

    @property
    def num_turns(self) -> int:
        return len(self.after)


def session_rng(seed: int) -> np.random.Generator:
    """The generator of a workload's prefixes and sessions (the 9th child of its seed)."""
    return np.random.default_rng(np.random.SeedSequence(seed).spawn(9)[8])


def _lengths(
    spec: WorkloadSpec, rng: np.random.Generator, n: int, message: LengthDist | None
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    prompts, outputs = get_mix(spec.mix).sample(rng, rng, n)
    if message is not None or spec.prompt is not None:
        prompts = (message or spec.prompt).sample(rng, n)  # type: ignore[union-attr]
    if spec.output is not None:
        outputs = spec.output.sample(rng, n)
    return prompts, outputs


def with_prefixes(wl: Workload, spec: WorkloadSpec, max_context: int | None) -> Workload:
    """``wl``'s generated requests as first turns (or single requests) of sessions with
    system prompts (module docstring); later turns in ``wl.sessions``."""
    rng = session_rng(spec.seed)
    cap = spec.max_context or max_context or math.inf
    first = wl.requests
    n = len(first)
    sys_tokens = spec.prefix.system_prompt_tokens if spec.prefix else 0
    shared = sys_tokens // BLOCK_TOKENS
    tenants = (
        rng.integers(0, spec.prefix.tenants, size=n) if spec.prefix else np.full(n, -1)
    ).tolist()
    plan = SessionPlan(session_base=(spec.prefix.tenants * shared if spec.prefix else 0))
    ss = spec.sessions
    counts = ss.turns.sample(rng, n).tolist() if ss else [1] * n
    later = sum(counts) - n
    msgs, outs = _lengths(spec, rng, later, ss.message if ss else None)
    if ss is None or later == 0:
        thinks: list[float] = [0.0] * later
    elif ss.think_time_dist == "fixed":
        thinks = [ss.think_time_s] * later
    else:
        thinks = rng.exponential(ss.think_time_s, size=later).tolist()
    kept: list[Request] = []
    chains: list[list[tuple[int, int, float]]] = []
    dropped = cut = 0
    j = 0
    for i, r in enumerate(first):
        p = r.num_prompt_tokens + sys_tokens
        steps = [(int(msgs[k]), int(outs[k]), thinks[k]) for k in range(j, j + counts[i] - 1)]
        j += counts[i] - 1
        if p + r.true_output_len > cap:
            dropped += 1
            continue
        chain, prev_p, prev_o = [], p, r.true_output_len
        for m, o, t in steps:
            q = prev_p + prev_o + m
            if q + o > cap:
                cut += 1
                break
            chain.append((q, o, t))
            prev_p, prev_o = q, o
        s = len(kept)
        plan.ids_of[s] = (int(tenants[i]), shared if spec.prefix else 0)
        r.req_id = s
        r.num_prompt_tokens = p
        if spec.prefix is not None and spec.qoe.ttft_s is None and r.qoe is not None:
            r.qoe = QoESpec(spec.qoe.ttft(p), r.qoe.tokens_per_s)
        r.hash_ids = plan.block_ids(s, p)
        r.session_id = s if ss is not None else None
        kept.append(r)
        chains.append(chain)
    next_id = len(kept)
    for s, chain in enumerate(chains):
        prev = s
        for q, o, t in chain:
            plan.after[prev] = Turn(next_id, q, o, t)
            plan.ttft[next_id] = spec.qoe.ttft(q)
            prev = next_id
            next_id += 1
    notes = list(wl.notes)
    if spec.prefix is not None:
        notes.append(
            f"{spec.prefix.tenants} tenant system prompts of {sys_tokens} tokens "
            f"({shared} shared blocks of {BLOCK_TOKENS})"
        )
    if dropped:
        notes.append(f"{dropped} session(s) whose first turn exceeds the context dropped")
    if ss is not None:
        notes.append(
            f"{len(kept)} sessions, {plan.num_turns} later turns arrive closed-loop "
            f"(think time after the previous answer)"
            + (f"; {cut} session(s) cut at the context window" if cut else "")
        )
    return type(wl)(kept, notes, wl.batch_jobs, plan if ss is not None else None)
