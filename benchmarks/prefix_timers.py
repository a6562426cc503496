"""Per-function calls and seconds, caching off against on, on the Mooncake conversation run.

``benchmarks/engine_calls.py``'s timers (``time.perf_counter_ns`` around each call,
≈ 0.15 µs a call included in every figure, nested calls counted in their callers too) on
the engine's per-decision functions, both KV managers' methods and the prefix cache's
hooks, for the ``--speed`` run of ``benchmarks/prefix_caching.py`` (Mooncake's
conversation trace, FAST '25, Apache-2.0, read from ``../shared/traces/``; 16 replicas),
caching off and on alternately after one untimed warm-up, the run with the least CPU time
of ``--repeat`` kept for each. Prints one row per function, largest on-minus-off first.
The simulation is unchanged (the wrappers only count and time).
Needs the pure-Python install: in the compiled build (``SLOSERVE_COMPILE=1``) the
engine's modules call each other directly and the wrappers see nothing.

    python benchmarks/prefix_timers.py [--router round-robin] [--repeat 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from call_timers import wrap
from prefix_caching import CONV, config

_STATS: dict[str, list[int]] = {}
_KV_METHODS = ("allocate", "free", "grow_many", "shrink_many", "lookup_prefix", "retired",
               "peek_prefix", "forget", "num_request_blocks", "blocks_needed", "swap_in",
               "swap_out", "take_transfer_tokens", "_register", "_reclaim")  # fmt: skip


def _wrap(owner: Any, name: str, label: str) -> Callable[..., Any]:
    return wrap(_STATS, owner, name, label, own=True)


def _install() -> None:
    from sloserve.cluster import cluster as cluster_mod
    from sloserve.engine import checks, chunk_run, decode_run, fastpath, prefix_cache, retire
    from sloserve.engine import instance as instance_mod
    from sloserve.engine import kv as kv_mod
    from sloserve.engine.prefix_cache import PrefixCachingKVManager
    from sloserve.policies.infermax import unified

    inst = instance_mod.Instance
    _wrap(cluster_mod.Cluster, "_route", "Cluster._route")
    # A prefix router's peeks: one call a decision for every candidate (or, on a tree
    # before that, one a candidate).
    from sloserve.cluster.prefix_routing import PrefixRouter
    from sloserve.cluster.replica import SimReplicaView

    for owner, n in (
        (SimReplicaView, "cached_prefix_tokens_many"),
        (SimReplicaView, "cached_prefix_tokens"),
        (PrefixRouter, "_miss_fractions"),
        (PrefixRouter, "_miss_fraction"),
    ):
        if n in owner.__dict__:
            _wrap(owner, n, f"{owner.__name__}.{n}")
    for n in ("_iterate", "_apply", "_complete", "interrupt", "add_request", "_record", "_done"):
        _wrap(inst, n, "Instance." + n)
    _wrap(unified.UnifiedScheduler, "schedule", "UnifiedScheduler.schedule")
    # Imported by name into instance.py: rebound there too.
    instance_mod.check_batch = _wrap(checks, "check_batch", "checks.check_batch")
    instance_mod.plan_run = _wrap(fastpath, "plan_run", "fastpath.plan_run")
    instance_mod.apply_run = _wrap(fastpath, "apply_run", "fastpath.apply_run")
    _wrap(retire, "retire", "retire.retire")
    _wrap(decode_run, "repeat", "decode_run.repeat")
    for n in ("refresh_queued", "unblock", "queue_lookup", "reuse_prefix"):
        _wrap(prefix_cache, n, "prefix_cache." + n)
    for n in ("advance", "chain_join", "plan"):
        _wrap(chunk_run, n, "chunk_run." + n)
    for cls in (kv_mod.PagedKVManager, PrefixCachingKVManager):
        for n in _KV_METHODS:
            if n in cls.__dict__:
                _wrap(cls, n, f"{cls.__name__}.{n}")


def _run(router: str, caching: bool) -> tuple[dict[str, tuple[int, int]], float]:
    import sloserve

    for v in _STATS.values():
        v[0] = v[1] = 0
    gc.collect()
    c0 = time.process_time()
    sloserve.simulate(config(router, caching, 0.0, 16))
    cpu = time.process_time() - c0
    return {k: (v[0], v[1]) for k, v in _STATS.items()}, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", default="round-robin")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    if not CONV.exists():
        sys.exit(f"no trace at {CONV}")
    _install()
    _run(a.router, True)  # untimed warm-up
    best: dict[bool, tuple[dict[str, tuple[int, int]], float]] = {}
    for _ in range(a.repeat):
        for caching in (False, True):
            stats, cpu = _run(a.router, caching)
            if caching not in best or cpu < best[caching][1]:
                best[caching] = (stats, cpu)
    off, on = best[False][0], best[True][0]
    print(f"load {os.getloadavg()}; CPU s off {best[False][1]:.2f}, on {best[True][1]:.2f}")
    print(f"{'function':40s} {'off calls':>9s} {'s':>7s} | {'on calls':>9s} {'s':>7s} | on-off")
    for k in sorted(off, key=lambda k: off[k][0] - on[k][0]):
        (ta, na), (tb, nb) = off[k], on[k]
        if na or nb:
            diff = (tb - ta) / 1e9
            print(f"{k:40s} {na:9d} {ta / 1e9:7.3f} | {nb:9d} {tb / 1e9:7.3f} | {diff:+.3f}")


if __name__ == "__main__":
    main()
