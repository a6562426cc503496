"""QLM's plan generator: solve time vs queue size (groups of 64 requests, 32 instances,
8 models), and one W_A-style multi-model cluster run.

    python benchmarks/qlm_plan.py                     # 1k..100k requests, a 2,000-request run
    python benchmarks/qlm_plan.py --sizes 640,6400 --run-requests 0
"""

from __future__ import annotations

import argparse
import time

from sloserve.experiments.qlm import plan_time_curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--sizes",
        default="1000,10000,50000,100000",
        help="queued requests (comma-separated); groups of 64",
    )
    ap.add_argument(
        "--run-requests",
        type=int,
        default=2000,
        help="requests of the W_A-style cluster run (0: skip)",
    )
    ap.add_argument("--replicas", type=int, default=16)
    args = ap.parse_args()
    groups = tuple(max(1, int(s) // 64) for s in args.sizes.split(","))
    curve = plan_time_curve(groups, seed=0)
    print(curve.to_string(index=False))
    if args.run_requests > 0:
        import sloserve

        rate = 0.9 * args.replicas
        cfg = {
            "workload": {
                "arrival": {"kind": "poisson", "rate": rate},
                "num_requests": args.run_requests,
                "duration_s": None,
                "slo": "qlm",
                "classes": {"rt": 0.5, "be": 0.5},
                "models": {"llama-2-7b": 0.4, "phi-2": 0.3, "llama-3-8b": 0.3},
            },
            "policy": "qlm",
        }
        half = args.replicas // 2
        cluster = {
            "replicas": [
                {"count": half, "profile": "llama-2-7b-a100"},
                {"count": args.replicas - half, "profile": "phi-2-a100"},
            ],
            "models": {"llama-3-8b": {"profile": "llama-3-8b-a100"}},
            "router": "qlm",
        }
        t0 = time.perf_counter()
        s = sloserve.simulate(cfg, cluster=cluster).summary
        dt = time.perf_counter() - t0
        print(
            f"W_A run: {s['requests']} requests on {args.replicas} replicas in {dt:.1f} s "
            f"(attainment {s['deadline_attainment']:.3f}, plan calls "
            f"{s['qlm']['plan_calls']}, solve {s['qlm']['plan_solve_s_total']:.2f} s)"
        )


if __name__ == "__main__":
    main()
