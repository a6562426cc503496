"""Count the Mooncake conversation runs' decisions with and without chunk runs.

The ``--speed`` runs of ``benchmarks/prefix_caching.py`` (the whole conversation trace,
16 replicas of Llama-3.1-8B/H100 under Sarathi), each with chunk runs
(``engine/chunk_run.py``) and without them (``chunk_run.eligible`` answering False), for
caching off and on and both routers: the decisions (``Instance._apply`` calls, a batch
each), the chains begun at a joining chunk and those of prompts that found cached
tokens, and the summary's SHA-256 (equal with and without chunk runs, or the script
fails). Counting only: no timing here.

    python benchmarks/prefix_decisions.py [--routers round-robin prefix-affinity]
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


def count(router: str, caching: bool, chains: bool) -> dict[str, Any]:
    import sloserve
    from sloserve.engine import chunk_run
    from sloserve.engine.instance import Instance

    n = {"decisions": 0, "joined": 0, "joined_cached": 0, "final_chunks": 0}
    apply, eligible, join, final = (
        Instance._apply,
        chunk_run.eligible,
        chunk_run.chain_join,
        chunk_run.start_final,
    )

    def counted_apply(self: Instance, out: Any, now: float) -> Any:
        n["decisions"] += 1
        return apply(self, out, now)

    def counted_join(inst: Instance, out: Any, pending: Any, split: Any) -> None:
        join(inst, out, pending, split)
        if pending.final is not None:
            n["joined"] += 1
            n["joined_cached"] += bool(pending.final.req.num_computed_tokens)

    def counted_final(inst: Instance, pending: Any) -> None:
        n["final_chunks"] += 1
        final(inst, pending)

    Instance._apply = counted_apply  # type: ignore[method-assign]
    chunk_run.chain_join, chunk_run.start_final = counted_join, counted_final
    if not chains:
        chunk_run.eligible = lambda inst: False
    try:
        s = sloserve.simulate(config(router, caching, 0.0, 16)).summary
    finally:
        Instance._apply = apply  # type: ignore[method-assign]
        chunk_run.eligible, chunk_run.chain_join, chunk_run.start_final = eligible, join, final
    s = {k: v for k, v in s.items() if k != "wall_seconds"}
    digest = hashlib.sha256(json.dumps(s, sort_keys=True, default=str).encode()).hexdigest()
    return {"router": router, "prefix_caching": caching, "chunk_runs": chains, **n,
            "summary": digest[:16]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routers", nargs="+", default=["round-robin", "prefix-affinity"])
    a = ap.parse_args()
    if not CONV.exists():
        sys.exit(f"no trace at {CONV}")
    for router in a.routers:
        for caching in (False, True):
            rows = [count(router, caching, chains) for chains in (False, True)]
            for row in rows:
                print(json.dumps(row))
            if rows[0]["summary"] != rows[1]["summary"]:
                sys.exit(f"{router}, caching {caching}: summaries differ with chunk runs")


if __name__ == "__main__":
    main()
