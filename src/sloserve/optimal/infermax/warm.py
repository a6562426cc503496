"""The CSP's warm start (§3.3 of ``papers/infermax.txt``): which policies seed it, whether
a recorded schedule is admissible as a hint, the relabelling that makes it respect the
symmetry breaking, and turning it into a complete CP-SAT hint (so the answer is never
worse than the warm start).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sloserve.costmodel.base import CostModel
from sloserve.engine.interface import Limits
from sloserve.optimal.infermax.model import _Built
from sloserve.optimal.infermax.options import CspOptions
from sloserve.optimal.infermax.schedule import (
    Evaluation,
    Job,
    Schedule,
    ScheduledBatch,
    evaluate,
)


def default_warm_start(options: CspOptions) -> tuple[str, ...]:
    names = ["vllm", "vllm-ef", "sarathi", "sarathi-ef"]
    if not options.allow_eviction:
        names = [n for n in names if n.endswith("-ef")]
    if not options.allow_hybrid:
        names = [n for n in names if n.startswith("vllm")]
    if not options.allow_chunked_prefill:
        names = [n for n in names if not n.startswith("sarathi")]
    return tuple(names)


def _feasible_for(sched: Schedule, options: CspOptions, jobs: Sequence[Job]) -> bool:
    """Whether a recorded schedule respects the forbidden features (for use as a hint)."""
    if not options.allow_eviction and sched.evictions:
        return False
    if sched.evictions < options.min_evictions:
        return False
    if options.allow_hybrid and options.allow_chunked_prefill:
        return True
    by_id = {j.req_id: j for j in jobs}
    computed = dict.fromkeys(by_id, 0)
    out = dict.fromkeys(by_id, 0)
    for b in sched.batches:
        for r in b.evict:
            computed[r] = 0
        kinds = set()
        for r, n in b.entries:
            remaining = by_id[r].input_tokens + out[r] - computed[r]
            decode = out[r] > 0 and remaining == 1
            kinds.add(decode)
            if not decode and n < remaining and not options.allow_chunked_prefill:
                return False
            computed[r] += n
            if computed[r] == by_id[r].input_tokens + out[r]:
                out[r] += 1
        if len(kinds) > 1 and not options.allow_hybrid:
            return False
    return True


def _canonical_hint(
    hint: Schedule, ev: Evaluation, jobs: Sequence[Job], cost_model: CostModel, limits: Limits
) -> tuple[Schedule, Evaluation]:
    """Relabel identical requests (same I, O, T) of ``hint`` so that they finish in the
    order the symmetry breaking requires (by position in ``jobs``); otherwise the hint
    violates it and is lost. Relabelling identical requests changes no time."""
    classes: dict[tuple[int, int, float], list[int]] = {}
    for j in jobs:
        classes.setdefault((j.input_tokens, j.output_tokens, j.arrival_s), []).append(j.req_id)
    mapping: dict[int, int] = {}
    for ids in classes.values():
        by_finish = sorted(ids, key=lambda r: (ev.finish[r], ids.index(r)))
        mapping.update(zip(by_finish, ids, strict=True))
    if all(a == b for a, b in mapping.items()):
        return hint, ev
    batches = tuple(
        ScheduledBatch(
            tuple((mapping[r], n) for r, n in b.entries), tuple(mapping[r] for r in b.evict)
        )
        for b in hint.batches
    )
    relabelled = Schedule(batches, hint.meta)
    return relabelled, evaluate(relabelled, jobs, cost_model, limits)


def _add_hint(
    model: Any,
    built: _Built,
    hint: Schedule,
    ev: Evaluation,
    jobs: Sequence[Job],
    q: Any,
) -> None:
    """Seed the search with a known schedule: its decisions and the states they imply."""
    J = len(built.used)
    ids = [j.req_id for j in jobs]
    for jj in range(1, J + 1):
        b = hint.batches[jj - 1] if jj <= hint.num_batches else ScheduledBatch(())
        run = dict(b.entries)
        state = ev.states[jj - 1] if jj <= hint.num_batches else None
        for i, rid in enumerate(ids):
            model.AddHint(built.c[i, jj], run.get(rid, 0))
            if built.evictable:
                model.AddHint(built.e[i, jj], int(rid in b.evict))
            if state is not None:
                held, gen = state[rid]
                model.AddHint(built.m[i, jj], held)
                model.AddHint(built.G[i, jj], gen)
            else:
                model.AddHint(built.m[i, jj], 0)
                model.AddHint(built.G[i, jj], jobs[i].output_tokens)
        model.AddHint(built.used[jj - 1], int(jj <= hint.num_batches))


def _complete_hint(model: Any, cp_model: Any, time_limit_s: float) -> bool:
    """Turn the partial hint (decisions and states) into a complete one.

    CP-SAT only tries a partial hint heuristically and on large models often loses it (the
    answer could then be worse than the warm start). Solving once with every hinted
    variable fixed fills in the rest (the hint is a valid schedule, so this is pure
    propagation); a complete, feasible hint is CP-SAT's first solution. Returns whether the
    hint is feasible for the model (False, e.g., when a better-than target excludes it).
    """
    fixer = cp_model.CpSolver()
    fixer.parameters.fix_variables_to_their_hinted_value = True
    fixer.parameters.num_workers = 1
    fixer.parameters.max_time_in_seconds = time_limit_s
    if fixer.Solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    values = [
        fixer.Value(model.get_int_var_from_proto_index(k))
        for k in range(len(model.Proto().variables))
    ]
    model.ClearHints()
    for k, v in enumerate(values):
        model.AddHint(model.get_int_var_from_proto_index(k), v)
    return True
