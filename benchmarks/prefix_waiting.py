"""Chunk runs refused only because a request waits, and what the policy answers instead.

The ``--speed`` runs of ``benchmarks/prefix_caching.py`` (Mooncake's conversation trace,
FAST '25, Apache-2.0, read from ``../shared/traces/``; 16 replicas of Llama-3.1-8B/H100
under Sarathi), caching off and on, for each router. A chunk run
(``engine/chunk_run.py``) is taken only when nothing waits on the replica; this counts,
without changing the run:

* ``refused_waiting``: joining chunks (``chain_join``) and middle runs
  (``fastpath.plan_run``) whose chain would have been taken had nothing waited (the
  same call asked again with the waiting queue hidden), and of those how many have
  middle chunks (``with_middle``: a chain stopping before the final chunk could skip a
  decision only for them);
* for the refused joins with middle chunks, whether the replica's next decision is the
  same batch again, repeatable (``middle_same``: the first middle chunk, as a chain
  through the middle chunks would have run it) or not (``middle_differs``: an arrival
  or an end came first, or the policy answered otherwise);
* for those prompts, the decision that runs their final chunk: whether the policy's batch
  is what the chain would have run (its decodes and the prompt's rest: ``final_same``) or
  admits a waiting request into the final chunk's spare prefill budget
  (``final_joined``), or an arrival reached the replica first (``cut``: the chain would
  have been dropped there anyway).

Needs the pure-Python install: in the compiled build (``SLOSERVE_COMPILE=1``) the
engine's modules call each other directly and the wrappers see nothing. Counting only,
no timing; the summary's SHA-256 is printed so that a run can be checked
unchanged by the counting.

    python benchmarks/prefix_waiting.py [--routers prefix-affinity round-robin]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefix_caching import CONV, config


def count(router: str, caching: bool) -> dict[str, Any]:
    import sloserve
    from sloserve.engine import chunk_run
    from sloserve.engine import instance as instance_mod
    from sloserve.engine.instance import Instance

    n = {
        "decisions": 0,
        "joined_chains": 0,
        "refused_waiting_join": 0,
        "refused_waiting_run": 0,
        "with_middle": 0,
        "final_same": 0,
        "final_joined": 0,
        "final_other": 0,
        "cut": 0,
        "middle_same": 0,
        "middle_differs": 0,
    }
    tracked: dict[int, Instance] = {}  # request -> its replica, until its final chunk
    # A refused join with middle chunks: its replica -> the batch its middle chunks repeat.
    joins: dict[int, tuple[Any, int]] = {}
    eligible, join, plan_run, apply = (
        chunk_run.eligible,
        chunk_run.chain_join,
        instance_mod.plan_run,
        Instance._apply,
    )
    interrupt = Instance.interrupt

    def blind(inst: Instance) -> bool:  # eligible, the waiting queue hidden
        waiting, inst.waiting = inst.waiting, []
        try:
            return eligible(inst)
        finally:
            inst.waiting = waiting

    def probe_join(inst: Instance, out: Any, pending: Any, split: Any) -> None:
        join(inst, out, pending, split)
        if pending.final is not None:
            n["joined_chains"] += 1
            return
        if not inst.waiting:
            return
        chunk_run.eligible = blind
        try:
            join(inst, out, pending, split)
        finally:
            chunk_run.eligible = eligible
        final, pending.final = pending.final, None
        if final is not None:
            n["refused_waiting_join"] += 1
            n["with_middle"] += final.middle > 1  # (a joining chunk, then middle ones)
            tracked[final.req.req_id] = inst
            if final.middle > 1:
                joins[inst.instance_id] = (out.batch, final.req.req_id)

    def probe_plan(inst: Instance, out: Any, now: float, cont: Any = None) -> Any:
        run = plan_run(inst, out, now, cont)
        if inst.waiting and (run is None or run.final is None):
            chunk_run.eligible = blind
            try:
                alt = plan_run(inst, out, now, cont)
            finally:
                chunk_run.eligible = eligible
            if alt is not None and alt.final is not None:
                n["refused_waiting_run"] += 1
                tracked[alt.final.req.req_id] = inst
        return run

    def counted_apply(self: Instance, out: Any, now: float) -> Any:
        n["decisions"] += 1
        joined = joins.pop(self.instance_id, None)
        if joined is not None:  # the decision after a refused join: its first middle chunk?
            same = (
                out.repeatable
                and not out.preempt
                and [(r.req_id, k) for r, k in out.batch] == [(r.req_id, k) for r, k in joined[0]]
            )
            n["middle_same" if same else "middle_differs"] += 1
        if tracked:
            for r, k in out.batch:
                if r.req_id in tracked and k == r.num_prompt_tokens - r.num_computed_tokens:
                    del tracked[r.req_id]  # its final chunk
                    others = [e for e in out.batch if e[0] is not r]
                    if all(e[1] == 1 and e[0].num_output_tokens for e in others):
                        n["final_same"] += 1
                    elif any(not e[0].num_output_tokens for e in others):
                        n["final_joined"] += 1
                    else:
                        n["final_other"] += 1
        return apply(self, out, now)

    def counted_interrupt(self: Instance) -> None:
        for rid in [rid for rid, inst in tracked.items() if inst is self]:
            n["cut"] += 1
            del tracked[rid]
        interrupt(self)

    Instance._apply = counted_apply  # type: ignore[method-assign]
    Instance.interrupt = counted_interrupt  # type: ignore[method-assign]
    chunk_run.chain_join, instance_mod.plan_run = probe_join, probe_plan
    try:
        s = sloserve.simulate(config(router, caching, 0.0, 16)).summary
    finally:
        Instance._apply, Instance.interrupt = apply, interrupt  # type: ignore[method-assign]
        chunk_run.chain_join, instance_mod.plan_run = join, plan_run
    s = {k: v for k, v in s.items() if k != "wall_seconds"}
    digest = hashlib.sha256(json.dumps(s, sort_keys=True, default=str).encode()).hexdigest()
    return {"router": router, "prefix_caching": caching, **n, "summary": digest[:16]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routers", nargs="+", default=["prefix-affinity", "round-robin"])
    a = ap.parse_args()
    if not CONV.exists():
        sys.exit(f"no trace at {CONV}")
    for router in a.routers:
        for caching in (False, True):
            print(json.dumps(count(router, caching)))


if __name__ == "__main__":
    main()
