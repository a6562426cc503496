"""Per-call cost of the extension points' hot methods whose arithmetic is in kernel modules
(``engine/kv_kernels.py``, ``costmodel/run_kernels.py``; docs/performance.md, "Tenth
round"), in whichever sloserve is imported: the pure-Python tree or a compiled install
(``SLOSERVE_COMPILE=1``). Shapes of the 4-replica Sarathi run of ``sim_e2e.py``: about 18
running decodes a replica, request ids in the thousands (ints above 256 are objects of
their own, which compiled code must not unbox and box again), 16-token blocks, a decode
run priced 21 iterations at a time.

    PYTHONPATH=src python benchmarks/kernel_calls.py [--decodes 18] [--repeat 5]
    PYTHONPATH=/tmp/compiled-install python benchmarks/kernel_calls.py

Prints the best of ``--repeat`` timings of each call, in microseconds.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decodes", type=int, default=18, help="running decodes (default 18)")
    ap.add_argument("--repeat", type=int, default=5, help="timings, best kept (default 5)")
    ap.add_argument("--number", type=int, default=20000, help="calls per timing")
    args = ap.parse_args()

    from sloserve.costmodel.base import batch_stats
    from sloserve.costmodel.profile import load_profile
    from sloserve.engine import compiled
    from sloserve.engine.kv import PagedKVManager

    cm = load_profile("llama-2-70b-a100x2").cost_model()
    nd = args.decodes
    stats = batch_stats(0, 0, 0, nd, nd * 900)
    _d, ends = cm.run_until(stats, 10.0, float("inf"), 21)
    t_next = ends[-1]  # the 21st iteration ends at the next event
    kv = PagedKVManager(100_000, 16)
    ids = list(range(5000, 5000 + nd))
    for r in ids:
        kv.allocate(r, 900 + r % 37)
    other = 9999

    def decode_steps() -> None:
        kv.grow_many(ids, 1)
        kv.grow_many(ids, 7)
        kv.shrink_many(ids, 8)

    def one_request() -> None:
        kv.allocate(other, 20)
        kv.free(other)

    calls: list[tuple[str, Callable[[], object]]] = [
        ("run_until, 21 decode-only iterations", lambda: cm.run_until(stats, 10.0, t_next, 21)),
        (f"grow_many by 1, by 7, shrink_many by 8 ({nd} requests)", decode_steps),
        (f"decode_blocks_needed ({nd} requests)", lambda: kv.decode_blocks_needed(ids)),
        ("blocks_needed", lambda: kv.blocks_needed(ids[3], 40)),
        ("allocate + free (a new request)", one_request),
    ]
    print(f"sloserve compiled: {compiled()}")
    for name, fn in calls:
        best = min(timeit.repeat(fn, number=args.number, repeat=args.repeat)) / args.number
        print(f"{best * 1e6:8.3f} µs  {name}")
    kv.check_invariants()


if __name__ == "__main__":
    main()
