"""QLM's model change: ``swap: drain`` (finish what the replica holds, then load) against
``flush`` (give it back to QLM's queues, load at once; ``cluster/qlm/flush.py``), on the
quick plan's W_A and W_A_large at each seed: attainment, throughput, loads cold/warm, the
drain time before loads (change applied to load begun), flushes and requests flushed, and
the warm-start claim (``qlm`` vs ``qlm-no-warm-start`` throughput) under each.

    python benchmarks/qlm_swap.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workloads", nargs="+", default=["W_A", "W_A_large"])
    ap.add_argument("--swaps", nargs="+", default=["drain", "flush"])
    args = ap.parse_args()
    import importlib

    from sloserve.cluster import lifecycle
    from sloserve.cluster.qlm.router import QLMRouter
    from sloserve.experiments.qlm.plan import TAIL_SHARE, Plan

    run_one = importlib.import_module("sloserve.experiments.qlm.reproduce").run_one
    routers: list[Any] = []
    orig_bind = QLMRouter.bind
    orig_change, orig_begin = lifecycle.change_model, lifecycle.begin_load
    asked: dict[int, float] = {}
    drains: list[float] = []

    def bind(self: Any, hooks: Any) -> None:
        routers.append(self)
        orig_bind(self, hooks)

    def change_model(clu: Any, rep: Any, model: str) -> None:
        if model != rep.spec.model:
            asked.setdefault(rep.replica_id, clu.env.now)
        orig_change(clu, rep, model)

    def begin_load(clu: Any, rep: Any, model: str) -> None:
        t = asked.pop(rep.replica_id, None)
        if t is not None:
            drains.append(clu.env.now - t)
        orig_begin(clu, rep, model)

    QLMRouter.bind = bind  # type: ignore[method-assign]
    lifecycle.change_model, lifecycle.begin_load = change_model, begin_load

    c0 = time.process_time()
    gains: dict[tuple[str, str], list[float]] = {}
    for seed in args.seeds:
        runs = Plan.quick(seed).runs
        for wl in args.workloads:
            for swap in args.swaps:
                tput = {}
                for system in ("qlm", "qlm-no-warm-start"):
                    run = next(
                        r
                        for r in runs
                        if r.workload == wl and r.system == system and r.tail_share == TAIL_SHARE
                    )
                    routers.clear()
                    asked.clear()
                    drains.clear()
                    row = run_one(dataclasses.replace(run, swap=swap))
                    st = routers[0].stats if routers else None
                    tput[system] = row["throughput_tokens_per_s"]
                    print(
                        f"seed {seed} {wl:9s} {swap:5s} {system:17s} attainment "
                        f"{row['attainment']:.3f} tok/s {row['throughput_tokens_per_s']:7.1f} "
                        f"loads cold/warm/read {row['model_loads_cold']}/{row['model_loads_warm']}/"
                        f"{row['model_loads_read']} "
                        f"drains {len(drains)} {sum(drains):6.1f} s flushes "
                        f"{st.flushes if st else '-'} flushed {st.flushed_requests if st else '-'}"
                    )
                off = tput["qlm-no-warm-start"]
                gains.setdefault((wl, swap), []).append(tput["qlm"] / off - 1 if off else 0.0)
    for (wl, swap), g in gains.items():
        print(
            f"{wl} {swap}: warm-start throughput gain "
            + " ".join(f"{x:+.0%}" for x in g)
            + f" (median {statistics.median(g):+.0%})"
        )
    print(f"CPU {time.process_time() - c0:.1f} s, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
