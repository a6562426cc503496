"""SHA-256 of the summaries and per-request tables of prefix-caching runs, for before/after
checks of the prefix cache (``engine/prefix_cache.py``): a change to its bookkeeping must
not change any result.

    PYTHONPATH=src python scripts/prefix_snapshot.py > after.txt    # on the new commit
    PYTHONPATH=<old>/src python scripts/prefix_snapshot.py > before.txt
    diff before.txt after.txt

Settings: the eight of ``benchmarks/prefix_caching.py --table`` (Mooncake's conversation
trace, FAST '25, Apache-2.0, read from ``../shared/traces/``, on 16 replicas), the session
workload on 8 replicas with three routers, and 4 replicas with a CPU tier at block sizes
16, 64 and 1,024 (eviction pressure, the CPU tier, the block-size mapping). Wall-clock
fields are dropped. 1–10 s of CPU per setting.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import prefix_caching as pc

import sloserve


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items() if "wall" not in k and k != "solve_seconds"}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def settings() -> list[tuple[str, dict[str, Any]]]:
    jobs = [
        (label, pc.config(router, caching, 64.0 if cpu < 0 else cpu, 16))
        for label, router, caching, cpu in pc.SETTINGS
    ]
    for router in ("round-robin", "session-affinity", "prefix-load"):
        cfg = pc.config(router, True, 0.0, 8)
        cfg["workload"] = pc.SESSIONS
        jobs.append((f"sessions {router}", cfg))
    for bs in (16, 64, 1024):
        cfg = pc.config("prefix-load", True, 8.0, 4)
        cfg["instance"]["block_size"] = bs
        jobs.append((f"4 replicas, block size {bs}, CPU tier 8 GiB", cfg))
    return jobs


def main() -> None:
    for label, cfg in settings():
        res = sloserve.simulate(cfg)
        summary = json.dumps(_clean(res.summary), sort_keys=True, default=str).encode()
        table = res.table.to_csv().encode()
        print(
            f"{label}: summary {hashlib.sha256(summary).hexdigest()[:16]} "
            f"table {hashlib.sha256(table).hexdigest()[:16]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
