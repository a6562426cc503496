"""Fixed schedules (InferMax §3.3 of ``papers/infermax.txt``): the CSP's output, its JSON
form and an exact evaluator.

A :class:`Schedule` is a list of batches; each batch names the requests it evicts
(recompute: their KV cache is dropped) and the requests it runs with their token counts.
That is exactly what a :class:`~sloserve.engine.interface.SchedulerOutput` carries, so a
schedule can be

* **evaluated** (:func:`evaluate`) by a small pure re-implementation of the engine's
  accounting, to price it with the cost model and check the limits without an engine;
* **replayed** through the real engine and **recorded** from any policy
  (:mod:`sloserve.optimal.infermax.replay`): the replay's latencies must equal the
  evaluation (and the CSP objective).

Semantics (the engine's, see ``engine/instance.py``): a batch starts when the previous one
ends, or, when the engine is idle, as soon as every request it runs has arrived. A request
emits a token in the batch that brings its computed tokens up to prompt + generated tokens;
an entry of one token for a request that has generated tokens and has exactly one token
left to compute is a *decode* (it reads its KV as decode attention), every other entry is a
*prefill* (prompt, chunk or refill after an eviction; attention work ``c·(c + cached)``).
KV is counted token-exactly (block size 1); a request holds at most ``I + O - 1`` tokens.
Evictions are recompute evictions (the CSP of InferMax §3.3 has no swapping).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloserve.core.errors import ConfigError, SchedulerViolation
from sloserve.core.request import Request
from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.engine.interface import (
    Limits,
)

SCHEDULE_FORMAT = "sloserve-schedule/1"


@dataclass(frozen=True, slots=True)
class Job:
    """One request of a scheduling instance, with its (known) output length."""

    req_id: int
    input_tokens: int
    """I: prompt tokens."""
    output_tokens: int
    """O: tokens to generate (the CSP, like the paper, knows them in advance)."""
    arrival_s: float = 0.0
    """T: arrival time (0 for the offline setting)."""

    def __post_init__(self) -> None:
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise ConfigError(f"request {self.req_id}: input and output must be >= 1 token")
        if not 0 <= self.arrival_s < math.inf:
            raise ConfigError(f"request {self.req_id}: arrival must be finite and >= 0")

    @property
    def max_kv(self) -> int:
        """I + O - 1: the last token's KV is never computed."""
        return self.input_tokens + self.output_tokens - 1

    def request(self) -> Request:
        return Request(
            req_id=self.req_id,
            arrival=self.arrival_s,
            num_prompt_tokens=self.input_tokens,
            true_output_len=self.output_tokens,
        )


def jobs_from_requests(requests: Sequence[Request]) -> list[Job]:
    return [Job(r.req_id, r.num_prompt_tokens, r.true_output_len, r.arrival) for r in requests]


def uniform_jobs(num_requests: int, input_tokens: int, output_tokens: int) -> list[Job]:
    """``num_requests`` identical offline requests (InferMax's fixed I and O workloads)."""
    if num_requests < 1:
        raise ConfigError("the instance needs at least one request")
    return [Job(i, input_tokens, output_tokens) for i in range(num_requests)]


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One iteration: evict ``evict`` (recompute), then run ``entries`` (req_id, tokens)."""

    entries: tuple[tuple[int, int], ...]
    evict: tuple[int, ...] = ()


@dataclass(frozen=True)
class Schedule:
    """A whole schedule for a set of jobs, plus free-form provenance (``meta``)."""

    batches: tuple[ScheduledBatch, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_batches(self) -> int:
        return len(self.batches)

    @property
    def evictions(self) -> int:
        return sum(len(b.evict) for b in self.batches)


@dataclass(frozen=True)
class Evaluation:
    """What a schedule achieves, priced by a cost model (all times in seconds)."""

    batch_start: tuple[float, ...]
    batch_end: tuple[float, ...]
    first_token: dict[int, float]
    finish: dict[int, float]
    evictions: int
    total_latency: float
    """Σ over requests of finish − arrival (the CSP's default objective)."""
    mean_latency: float
    mean_ttft: float
    mean_tpot: float
    """Mean over requests with O > 1 of (finish − first token) / (O − 1)."""
    makespan: float
    states: tuple[dict[int, tuple[int, int]], ...] = ()
    """Per batch, per request: (KV tokens held during the batch, tokens generated after it)."""

    def metric(self, objective: str) -> float:
        """The value of ``objective`` (latency, ttft, tpot, makespan) for this schedule."""
        return {
            "latency": self.total_latency,
            "ttft": self.mean_ttft,
            "tpot": self.mean_tpot,
            "makespan": self.makespan,
        }[objective]


def evaluate(
    schedule: Schedule, jobs: Sequence[Job], cost_model: CostModel, limits: Limits
) -> Evaluation:
    """Price ``schedule`` and check it against the limits, as the engine would.

    Raises :class:`~sloserve.core.errors.SchedulerViolation` (policy ``"schedule"``) on a
    batch the engine would refuse, or when a request is left unfinished.
    """
    by_id = {j.req_id: j for j in jobs}
    if len(by_id) != len(jobs):
        raise ConfigError("request ids must be unique")
    computed = dict.fromkeys(by_id, 0)
    out = dict.fromkeys(by_id, 0)
    done: set[int] = set()
    first: dict[int, float] = {}
    finish: dict[int, float] = {}
    starts: list[float] = []
    ends: list[float] = []
    states: list[dict[int, tuple[int, int]]] = []
    now = 0.0
    evictions = 0

    def bad(b: int, limit: str, detail: str) -> SchedulerViolation:
        return SchedulerViolation("schedule", limit, f"batch {b}: {detail}")

    for b, batch in enumerate(schedule.batches):
        if not batch.entries:
            raise bad(b, "batch", "no request runs (the engine cannot price an empty batch)")
        start = max([now] + [by_id[r].arrival_s for r, _ in batch.entries if r in by_id])
        for r in batch.evict:
            if r not in by_id or r in done or computed[r] == 0:
                raise bad(b, "preempt", f"request {r} holds no KV cache")
            computed[r] = 0
            evictions += 1
        seen: set[int] = set()
        tokens = prefill = n_pf = work = n_dec = ctx = 0
        for r, n in batch.entries:
            if r not in by_id or r in done or r in seen or r in batch.evict:
                raise bad(b, "batch", f"request {r} cannot run here")
            seen.add(r)
            seq = by_id[r].input_tokens + out[r]
            remaining = seq - computed[r]
            if not 1 <= n <= remaining:
                raise bad(b, "batch", f"request {r} given {n} tokens, must be 1..{remaining}")
            tokens += n
            if out[r] and remaining == 1:
                n_dec += 1
                ctx += computed[r]
            else:
                prefill += n
                n_pf += 1
                work += n * (n + computed[r])
        if tokens > limits.max_batch_tokens:
            raise bad(b, "C (max batch tokens)", f"{tokens} > {limits.max_batch_tokens}")
        if prefill > limits.max_prefill_tokens:
            raise bad(b, "P (max prefill tokens)", f"{prefill} > {limits.max_prefill_tokens}")
        for r, n in batch.entries:
            computed[r] += n
        held = {r: c for r, c in computed.items() if c > 0 and r not in done}
        if sum(held.values()) > limits.kv_capacity_tokens:
            raise bad(b, "M (KV capacity)", f"{sum(held.values())} > {limits.kv_capacity_tokens}")
        if len(held) > limits.max_running:
            raise bad(b, "R_max (max running)", f"{len(held)} > {limits.max_running}")
        stats = BatchStats(
            num_prefill_tokens=prefill,
            num_prefill_seqs=n_pf,
            prefill_attn_work=work,
            num_decode=n_dec,
            decode_context_sum=ctx,
        )
        end = start + cost_model.batch_time(stats)
        starts.append(start)
        ends.append(end)
        for r, _n in batch.entries:
            if computed[r] == by_id[r].input_tokens + out[r]:
                out[r] += 1
                first.setdefault(r, end)
                if out[r] >= by_id[r].output_tokens:
                    finish[r] = end
        states.append({r: (held.get(r, 0), out[r]) for r in by_id})
        for r in finish:
            if r not in done:
                done.add(r)
                computed[r] = 0
        now = end
    left = sorted(set(by_id) - done)
    if left:
        raise SchedulerViolation(
            "schedule", "termination", f"requests {left} do not finish within the schedule"
        )
    n = len(jobs)
    lat = [finish[j.req_id] - j.arrival_s for j in jobs]
    tpots = [
        (finish[j.req_id] - first[j.req_id]) / (j.output_tokens - 1)
        for j in jobs
        if j.output_tokens > 1
    ]
    return Evaluation(
        batch_start=tuple(starts),
        batch_end=tuple(ends),
        first_token=first,
        finish=finish,
        evictions=evictions,
        total_latency=float(sum(lat)),
        mean_latency=float(sum(lat)) / n,
        mean_ttft=sum(first[j.req_id] - j.arrival_s for j in jobs) / n,
        mean_tpot=sum(tpots) / len(tpots) if tpots else 0.0,
        makespan=max(ends) if ends else 0.0,
        states=tuple(states),
    )


# ----------------------------------------------------------------------------- JSON
def schedule_to_dict(
    schedule: Schedule, jobs: Sequence[Job], limits: Limits, profile: str | None = None
) -> dict[str, Any]:
    """A self-contained JSON-able document: the instance, the limits and the batches."""
    return {
        "format": SCHEDULE_FORMAT,
        "profile": profile,
        "limits": {
            "C": limits.max_batch_tokens,
            "P": limits.max_prefill_tokens,
            "M": limits.kv_capacity_tokens,
            "R_max": limits.max_running,
        },
        "requests": [
            {
                "id": j.req_id,
                "input": j.input_tokens,
                "output": j.output_tokens,
                "arrival_s": j.arrival_s,
            }
            for j in jobs
        ],
        "batches": [
            {"run": [[r, n] for r, n in b.entries], "evict": list(b.evict)}
            for b in schedule.batches
        ],
        "meta": dict(schedule.meta),
    }


def write_schedule(
    path: Path, schedule: Schedule, jobs: Sequence[Job], limits: Limits, profile: str | None
) -> None:
    path.write_text(json.dumps(schedule_to_dict(schedule, jobs, limits, profile), indent=1) + "\n")


def schedule_from_dict(doc: Any) -> tuple[Schedule, list[Job], Limits, str | None]:
    """Parse :func:`schedule_to_dict`'s document; malformed input is a ConfigError."""
    try:
        if doc.get("format") != SCHEDULE_FORMAT:
            raise ConfigError(f"not a schedule file (format must be {SCHEDULE_FORMAT!r})")
        lim = doc["limits"]
        limits = Limits(int(lim["C"]), int(lim["P"]), int(lim["M"]), int(lim["R_max"]), 1)
        jobs = [
            Job(int(r["id"]), int(r["input"]), int(r["output"]), float(r.get("arrival_s", 0.0)))
            for r in doc["requests"]
        ]
        batches = tuple(
            ScheduledBatch(
                tuple((int(r), int(n)) for r, n in b["run"]),
                tuple(int(r) for r in b.get("evict", [])),
            )
            for b in doc["batches"]
        )
        profile = doc.get("profile")
        meta = dict(doc.get("meta") or {})
    except ConfigError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"malformed schedule document: {e!r}") from e
    return Schedule(batches, meta), jobs, limits, (str(profile) if profile else None)


def read_schedule(path: Path) -> tuple[Schedule, list[Job], Limits, str | None]:
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read schedule {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text file ({e.reason})") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from e
    return schedule_from_dict(doc)
