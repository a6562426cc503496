"""Why QLM's model loads are cold: one W_A run (``qlm_run.py``'s configuration) with the
cluster's model loads and QLM's CPU memory watched from outside (monkeypatched, nothing in
the package changes). Per run: model changes issued, loads by tier, and for each cold load
why its model was not warm when the load began:

- ``read in progress``: the prefetch read had begun but not ended (remaining s printed;
  the load pays only that rest plus the copy from CPU memory, the cluster's tier ``read``,
  when that is quicker than a cold load);
- ``read queued``: behind another model's read on the replica's one read stream;
- ``read ended since last tick``: the read had ended but QLM had not looked since;
- ``not wanted``: the model was not among the replica's wanted models at its last update
  (never queued there, dropped, or over capacity);
- ``warm in QLM, not in cluster``: QLM's set had it but the cluster's did not (a hook bug);
- ``no QLM memory``: the replica had no CPU memory yet (never ticked).

It also sums, for warm and for cold loads, the drains before them (from the change order
to the load's start: the replica finishing what it holds) and the loads themselves.

    python benchmarks/qlm_warm_diag.py                        # 50,000 requests, 16 replicas
    python benchmarks/qlm_warm_diag.py --requests 5000 --replicas 4
    python benchmarks/qlm_warm_diag.py --quick W_A_large   # the quick plan's qlm run
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--rate-per-replica", type=float, default=7.0)
    ap.add_argument("--verbose", action="store_true", help="one line per load")
    ap.add_argument("--quick", metavar="WORKLOAD", help="the quick plan's run of this workload")
    ap.add_argument("--system", default="qlm", help="with --quick: the system")
    args = ap.parse_args()
    from qlm_run import wa_config  # the same W_A run

    import sloserve
    from sloserve.cluster import lifecycle
    from sloserve.cluster.cluster import Cluster
    from sloserve.cluster.qlm.router import QLMRouter
    from sloserve.cluster.replica import Replica
    from sloserve.experiments.qlm.plan import TAIL_SHARE

    routers: list[Any] = []
    orig_bind = QLMRouter.bind

    def bind(self: Any, hooks: Any) -> None:
        routers.append(self)
        orig_bind(self, hooks)

    loads: list[dict[str, Any]] = []
    changes: list[tuple[float, int, str, str, str]] = []
    orig_begin, orig_change = lifecycle.begin_load, lifecycle.change_model

    def change_model(clu: Cluster, rep: Replica, model: str) -> None:
        changes.append((clu.env.now, rep.replica_id, rep.spec.model, model, rep.status.name))
        orig_change(clu, rep, model)

    def begin_load(clu: Cluster, rep: Replica, model: str) -> None:
        now, rid = clu.env.now, rep.replica_id
        in_cluster = model in rep.warm_models
        rec: dict[str, Any] = {"t": now, "rid": rid, "from": rep.spec.model, "to": model}
        qr = routers[0] if routers else None
        mem = qr.cpu_mem.get(rid) if qr is not None else None
        if in_cluster:
            why = "warm"
        elif mem is None:
            why = "no QLM memory"
        elif model in mem.resident:
            why = "warm in QLM, not in cluster"
        else:
            why = "not wanted"
            for m, start, end in mem.reads:
                if m != model:
                    continue
                if end <= now:
                    why = "read ended since last tick"
                elif start <= now:
                    why = "read in progress"
                    rec["remaining_s"] = end - now
                    rec["read_s"] = end - start
                else:
                    why = "read queued"
                    rec["remaining_s"] = end - now
        rec["why"] = why
        if mem is not None:
            rec["resident"] = sorted(mem.resident)
            rec["reads"] = [(m, round(s - now, 1), round(e - now, 1)) for m, s, e in mem.reads]
        # the change that led here: the last ChangeModel to this model on this replica
        for t, r, _old, m, _st in reversed(changes):
            if r == rid and m == model:
                rec["since_change_s"] = now - t
                break
        loads.append(rec)
        orig_begin(clu, rep, model)
        start, end, _m, tier = rep.loads[-1]
        rec["load_s"] = end - start
        rec["tier"] = tier  # "read": it waited for the rest of the read under way

    QLMRouter.bind = bind  # type: ignore[method-assign]
    lifecycle.begin_load = begin_load  # the cluster's own calls go through the module
    lifecycle.change_model = change_model
    cfg, cluster = wa_config(args.requests, args.replicas, args.rate_per_replica, "qlm")
    w0, c0 = time.perf_counter(), time.process_time()
    if args.quick:
        from sloserve.experiments.qlm.plan import Plan
        from sloserve.experiments.qlm.reproduce import run_one

        run = next(
            r
            for r in Plan.quick().runs
            if r.workload == args.quick and r.system == args.system and r.tail_share == TAIL_SHARE
        )
        row = run_one(run)
        what = f"{run.key}: attainment {row['attainment']:.3f}, {row['requests']} requests"
        loads_by_tier = {
            "disk": row["model_loads_cold"],
            "cpu": row["model_loads_warm"],
            "read": row["model_loads_read"],
        }
    else:
        s = sloserve.simulate(cfg, cluster=cluster).summary
        what = (
            f"W_A qlm: {s['requests']} requests on {args.replicas} replicas, attainment "
            f"{s['deadline_attainment']:.3f}"
        )
        loads_by_tier = s.get("model_loads_by_tier") or {}
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    issued = routers[0].stats.model_changes if routers else None
    print(
        f"{what}; wall {wall:.1f} s, CPU {cpu:.1f} s, load {os.getloadavg()[0]:.2f}; model "
        f"changes issued {issued}, change_model calls {len(changes)}, loads {loads_by_tier}"
    )
    print("loads by reason:", dict(Counter(r["why"] for r in loads)))
    print("loads by (from -> to, reason, tier):")
    for k, n in sorted(Counter((r["from"], r["to"], r["why"], r["tier"]) for r in loads).items()):
        print(f"  {k}: {n}")
    for tier in ("warm", "not warm"):
        xs = [r for r in loads if (r["why"] == "warm") == (tier == "warm")]
        drain = sum(r.get("since_change_s", 0.0) for r in xs)
        load = sum(r["load_s"] for r in xs)
        print(f"{tier} loads {len(xs)}: drains before them {drain:.1f} s, loads {load:.1f} s")
    if routers:
        mems = routers[0].cpu_mem
        print(
            f"CPU memories: {len(mems)}, prefetch bytes read "
            f"{sum(m.bytes_read for m in mems.values()) / 1e9:.1f} GB"
        )
    if args.verbose:
        for r in loads:
            print(" ", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()})


if __name__ == "__main__":
    main()
