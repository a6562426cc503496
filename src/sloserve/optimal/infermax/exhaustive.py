"""Exhaustive search over schedules, for checking the CSP on tiny instances.

Independent of the CSP model: it enumerates, from every reachable state, every batch the
engine would accept (each request idles, is evicted, or runs any admissible number of
tokens), prices it with the float cost model, and runs a uniform-cost (Dijkstra) search
over states. With all requests arriving at 0 the total latency is additive over batches —
a batch of duration t with k unfinished requests adds k·t — so the cheapest path to "all
finished" is the optimal schedule. Exponential in the number of requests: keep to 2–4
requests with a handful of tokens.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sloserve.core.errors import ConfigError
from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.engine.interface import Limits
from sloserve.optimal.infermax.schedule import Job, Schedule, ScheduledBatch

# per request: (computed KV tokens, tokens generated); finished = generated == O
_State = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ExhaustiveResult:
    value: float
    """Optimal total latency (or makespan), seconds."""
    schedule: Schedule
    states_expanded: int


def _actions(
    k: int, job: Job, state: tuple[int, int], allow_eviction: bool, chunked: bool
) -> list[tuple[str, int]]:
    computed, out = state
    if out >= job.output_tokens:
        return [("idle", 0)]
    acts: list[tuple[str, int]] = [("idle", 0)]
    if computed > 0 and allow_eviction:
        acts.append(("evict", 0))
    remaining = job.input_tokens + out - computed
    if out and remaining == 1:
        acts.append(("run", 1))
    elif chunked:
        acts.extend(("run", n) for n in range(1, remaining + 1))
    else:
        acts.append(("run", remaining))
    return acts


def exhaustive_optimum(
    jobs: Sequence[Job],
    limits: Limits,
    cost_model: CostModel,
    *,
    objective: str = "latency",
    allow_eviction: bool = True,
    allow_hybrid: bool = True,
    allow_chunked_prefill: bool = True,
    max_batches: int | None = None,
    max_states: int = 2_000_000,
) -> ExhaustiveResult:
    """The optimal offline schedule by exhaustive search (``latency`` or ``makespan``)."""
    if objective not in ("latency", "makespan"):
        raise ConfigError("exhaustive search supports the latency and makespan objectives")
    if any(j.arrival_s != 0 for j in jobs):
        raise ConfigError("exhaustive search is offline: every arrival must be 0")
    n = len(jobs)
    start: _State = tuple((0, 0) for _ in jobs)
    # heap of (cost, tiebreak, depth, state); parents for the path
    heap: list[tuple[float, int, int, _State]] = [(0.0, 0, 0, start)]
    best: dict[tuple[int, _State], float] = {(0, start): 0.0}
    parent: dict[tuple[int, _State], tuple[tuple[int, _State], ScheduledBatch]] = {}
    seq = itertools.count(1)
    expanded = 0
    while heap:
        cost, _t, depth, state = heapq.heappop(heap)
        key = (depth if max_batches is not None else 0, state)
        if cost > best.get(key, float("inf")):
            continue
        if all(out >= j.output_tokens for (_c, out), j in zip(state, jobs, strict=True)):
            return ExhaustiveResult(cost, _path(parent, key), expanded)
        expanded += 1
        if expanded > max_states:
            raise ConfigError(f"exhaustive search gave up after {max_states} states")
        if max_batches is not None and depth >= max_batches:
            continue
        alive = sum(1 for (_c, out), j in zip(state, jobs, strict=True) if out < j.output_tokens)
        for nxt, batch, dur in _successors(
            jobs, state, limits, cost_model, allow_eviction, allow_hybrid, allow_chunked_prefill
        ):
            step = dur * alive if objective == "latency" else dur
            nkey = (depth + 1 if max_batches is not None else 0, nxt)
            c2 = cost + step
            if c2 < best.get(nkey, float("inf")):
                best[nkey] = c2
                parent[nkey] = (key, batch)
                heapq.heappush(heap, (c2, next(seq), depth + 1, nxt))
    raise ConfigError(f"no schedule serves these {n} requests under the limits")


def _successors(
    jobs: Sequence[Job],
    state: _State,
    limits: Limits,
    cost_model: CostModel,
    allow_eviction: bool,
    allow_hybrid: bool,
    chunked: bool,
) -> Iterator[tuple[_State, ScheduledBatch, float]]:
    options = [
        _actions(k, j, s, allow_eviction, chunked)
        for k, (j, s) in enumerate(zip(jobs, state, strict=True))
    ]
    for combo in itertools.product(*options):
        if all(a != "run" for a, _n in combo):
            continue  # the engine cannot run an empty iteration
        tokens = prefill = n_pf = work = n_dec = ctx = 0
        held = running = 0
        new: list[tuple[int, int]] = []
        entries: list[tuple[int, int]] = []
        evict: list[int] = []
        for job, (computed, out), (a, n) in zip(jobs, state, combo, strict=True):
            if a == "evict":
                evict.append(job.req_id)
                new.append((0, out))
                continue
            if a == "run":
                entries.append((job.req_id, n))
                tokens += n
                remaining = job.input_tokens + out - computed
                if out and remaining == 1:
                    n_dec += 1
                    ctx += computed
                else:
                    prefill += n
                    n_pf += 1
                    work += n * (n + computed)
                computed += n
                if computed == job.input_tokens + out:
                    out += 1
            if computed > 0:
                held += computed
                running += 1
            if out >= job.output_tokens:
                computed = 0  # finished: KV freed after the batch
            new.append((computed, out))
        if tokens > limits.max_batch_tokens or prefill > limits.max_prefill_tokens:
            continue
        if held > limits.kv_capacity_tokens or running > limits.max_running:
            continue
        if not allow_hybrid and n_dec and n_pf:
            continue
        dur = cost_model.batch_time(
            BatchStats(
                num_prefill_tokens=prefill,
                num_prefill_seqs=n_pf,
                prefill_attn_work=work,
                num_decode=n_dec,
                decode_context_sum=ctx,
            )
        )
        yield tuple(new), ScheduledBatch(tuple(entries), tuple(evict)), dur


def _path(
    parent: dict[tuple[int, _State], tuple[tuple[int, _State], ScheduledBatch]],
    key: tuple[int, _State],
) -> Schedule:
    batches: list[ScheduledBatch] = []
    while key in parent:
        key, batch = parent[key]
        batches.append(batch)
    return Schedule(tuple(reversed(batches)), {"source": "exhaustive"})
