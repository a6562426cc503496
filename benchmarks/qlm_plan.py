"""QLM's plan generator: solve time vs queue size (groups of 64 requests, 32 instances,
8 models). A whole W_A cluster run is ``benchmarks/qlm_run.py``.

    python benchmarks/qlm_plan.py                     # 1k..100k requests
    python benchmarks/qlm_plan.py --sizes 640,6400
"""

from __future__ import annotations

import argparse

from sloserve.experiments.qlm import plan_time_curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--sizes",
        default="1000,10000,50000,100000",
        help="queued requests (comma-separated); groups of 64",
    )
    args = ap.parse_args()
    groups = tuple(max(1, int(s) // 64) for s in args.sizes.split(","))
    curve = plan_time_curve(groups, seed=0)
    print(curve.to_string(index=False))


if __name__ == "__main__":
    main()
