"""Caching on against off, split: the caching manager's fixed cost, then caching itself.

Mooncake's conversation trace (FAST '25, Apache-2.0, read from ``../shared/traces/``) on
16 replicas, as ``prefix_caching.py --speed``, in three modes run alternately in one
process (best of ``--repeat`` CPU seconds each, the previous run's garbage collected
before each, one untimed warm-up):

* ``off``: the plain paged manager;
* ``idle``: the prefix-caching manager and every hook of it, but no request is ever
  looked up (``prefix_cache.queue_lookup`` drops it), so nothing is cached, held or
  evicted: the run's results are those of ``off`` (checked: the summary's SHA-256 without
  the prefix fields must match, or the script fails). ``idle - off`` is what the manager
  costs per call when it caches nothing;
* ``on``: caching. ``on - idle`` is caching itself: lookups, registrations, evictions,
  holding, and the engine work that differs because the simulated run differs.

Each mode also reports the collector's passes per generation and their CPU seconds
(``gc.callbacks``), the time and count the cache's objects cost it.

    python benchmarks/prefix_overhead.py [--router round-robin] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefix_caching import CONV, config


def run(router: str, mode: str) -> dict[str, Any]:
    import sloserve
    from sloserve.engine import prefix_cache

    real = prefix_cache.queue_lookup
    passes = [0, 0, 0]
    took = [0.0, 0.0, 0.0]
    start = [0.0]

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            start[0] = time.process_time()
        else:
            passes[info["generation"]] += 1
            took[info["generation"]] += time.process_time() - start[0]

    if mode == "idle":
        prefix_cache.queue_lookup = lambda kv, req: None
    gc.collect()
    gc.callbacks.append(watch)
    try:
        c0 = time.process_time()
        s = sloserve.simulate(config(router, mode != "off", 0.0, 16)).summary
        cpu = time.process_time() - c0
    finally:
        gc.callbacks.remove(watch)
        prefix_cache.queue_lookup = real
    kept = {k: v for k, v in s.items() if "wall" not in k and "prefix" not in k}
    kept.pop("prefill_tokens_saved", None)
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()
    return {"mode": mode, "cpu_s": cpu, "gc_passes": passes, "gc_s": took, "digest": digest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", default="round-robin")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if not CONV.exists():
        sys.exit(f"no trace at {CONV}")
    print(json.dumps({"loadavg": os.getloadavg()}))
    run(a.router, "on")  # untimed warm-up (imports, caches)
    best: dict[str, dict[str, Any]] = {}
    for _ in range(a.repeat):
        for mode in ("off", "idle", "on"):  # alternating: all see the same load
            r = run(a.router, mode)
            if mode not in best or r["cpu_s"] < best[mode]["cpu_s"]:
                best[mode] = r
    for r in best.values():
        shown = {"cpu_s": round(r["cpu_s"], 3), "gc_s": [round(t, 3) for t in r["gc_s"]]}
        print(json.dumps({**r, **shown, "digest": r["digest"][:16]}))
    if best["idle"]["digest"] != best["off"]["digest"]:
        sys.exit("the idle caching manager changed the run's results")
    off, idle, on = (best[m]["cpu_s"] for m in ("off", "idle", "on"))
    print(
        f"{a.router}: off {off:.2f} s, idle manager {idle:.2f} s (+{idle - off:.2f}), "
        f"on {on:.2f} s (+{on - idle:.2f} caching); on/off {on / off:.2f}"
    )
    print(json.dumps({"loadavg": os.getloadavg()}))


if __name__ == "__main__":
    main()
