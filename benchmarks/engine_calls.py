"""Calls and time per call of the engine's per-decision and per-arrival functions.

Runs one ``sloserve simulate`` command in this process with a fixed set of functions
wrapped by a ``time.perf_counter_ns`` timer (the simulation itself is unchanged: the
wrappers only count and time) and prints, per function, its calls, total seconds and
microseconds per call. A profiler inflates every Python call several-fold and so
misweighs small functions called often; these timers cost ≈ 0.1 µs a call (printed as
``(empty wrapper)``), which is in every figure. Times nest: ``_apply`` includes
``plan_run``, ``check_batch`` and the others it calls, ``interrupt`` includes
``shrink_many``, ``Cluster._route`` includes ``interrupt``. Wall clock, so on a shared
machine compare only runs made one after the other, and prefer
``benchmarks/engine_cpu.py --base`` (paired, CPU time) for a change's effect.

    python benchmarks/engine_calls.py -- simulate --profile llama-2-70b-a100x2 \\
        --max-running 128 --max-batch-tokens 4096 --trace T.csv --policy sarathi \\
        --replicas 4 --router least-outstanding --json
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from typing import Any

from call_timers import wrap

from sloserve.cluster import cluster as cluster_mod
from sloserve.engine import checks, chunk_run, continuation, fastpath, filling, retire
from sloserve.engine import instance as instance_mod
from sloserve.engine import kv as kv_mod
from sloserve.policies.infermax import unified

_STATS: dict[str, list[int]] = {}


def _wrap(owner: Any, name: str, label: str) -> Callable[..., Any]:
    return wrap(_STATS, owner, name, label)


def _install() -> None:
    inst = instance_mod.Instance
    _wrap(cluster_mod.Cluster, "_route", "Cluster._route (arrival)")
    _wrap(inst, "interrupt", "Instance.interrupt")
    _wrap(inst, "_apply", "Instance._apply")
    _wrap(retire, "retire", "retire.retire")
    _wrap(inst, "_record", "Instance._record")
    _wrap(unified.UnifiedScheduler, "schedule", "UnifiedScheduler.schedule")
    # Imported by name into instance.py: rebound there too.
    instance_mod.check_batch = _wrap(checks, "check_batch", "checks.check_batch")
    instance_mod.plan_run = _wrap(fastpath, "plan_run", "fastpath.plan_run")
    instance_mod.apply_run = _wrap(fastpath, "apply_run", "fastpath.apply_run")
    _wrap(chunk_run, "chain_join", "chunk_run.chain_join")
    _wrap(continuation, "deliver", "continuation.deliver")
    _wrap(filling, "prune", "filling.prune")
    _wrap(kv_mod.PagedKVManager, "grow_many", "PagedKVManager.grow_many")
    _wrap(kv_mod.PagedKVManager, "shrink_many", "PagedKVManager.shrink_many")


def _wrapper_cost(n: int = 200_000) -> None:
    holder = type("_Empty", (), {"f": staticmethod(lambda: None)})
    _wrap(holder, "f", "(empty wrapper)")
    f = holder.f
    for _ in range(n):
        f()


def main(argv: list[str]) -> int:
    _install()
    _wrapper_cost()
    from sloserve.cli import main as cli_main

    sys.argv = ["sloserve", *argv]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            cli_main()
        except SystemExit as e:
            if e.code:
                print(f"the command failed: exit status {e.code}", file=sys.stderr)
                return 2
    for label, (ns, calls) in _STATS.items():
        per = ns / calls / 1e3 if calls else 0.0
        print(f"{label:30s} calls {calls:8d}  total {ns / 1e9:7.3f} s  {per:7.2f} us/call")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0)
    raise SystemExit(main(args))
