"""Where could QLM's eviction and its plan beat EDF on a single model (§8.2)? W_B (the
reproduction's single-model multi-SLO workload, ``experiments/qlm/plan.py``) under the
knobs the paper's testbed differs in: the rt deadline, the rt share, R_max and the model
(Llama-2-70B on two A100s, tensor parallel 2). Each point runs QLM, QLM without eviction,
``edf-swap`` (the paper's EDF as we build it) and ``edf-swap-edf`` (the same router with
EDF also inside the replica: our QLM agent without eviction). One 40 s run per point,
seed 0; prints attainment (rt) and tokens/s, and the process's CPU seconds.

    python benchmarks/qlm_eviction.py                  # the table on QLM's docs page
    python benchmarks/qlm_eviction.py --only 70b       # the Llama-2-70B points
"""

from __future__ import annotations

import argparse
import resource
from typing import Any

POINTS: tuple[tuple[str, float, float, int, float, str | None], ...] = (
    # (label, rate req/s, rt share, R_max, rt deadline s, profile of both replicas)
    ("7b-80-dl10", 80.0, 0.5, 256, 10.0, None),
    ("7b-80-rt20-dl10", 80.0, 0.2, 256, 10.0, None),
    ("7b-40-rmax16-dl10", 40.0, 0.2, 16, 10.0, None),
    ("7b-20-rmax8", 20.0, 0.2, 8, 30.0, None),
    ("70b-10-rt20", 10.0, 0.2, 256, 30.0, "roofline:llama-2-70b@a100-80gbx2"),
    ("70b-16-rt20", 16.0, 0.2, 256, 30.0, "roofline:llama-2-70b@a100-80gbx2"),
    ("70b-16-rt50", 16.0, 0.5, 256, 30.0, "roofline:llama-2-70b@a100-80gbx2"),
)
SYSTEMS = ("qlm", "qlm-no-eviction", "edf-swap", "edf-swap-edf")


def run_point(
    system: str, rate: float, rt_share: float, r_max: int, rt_deadline: float, prof: str | None
) -> dict[str, Any]:
    """One W_B run with the point's knobs; the summary's numbers."""
    from sloserve.cluster.config import ClusterConfig
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.qlm.plan import Run
    from sloserve.experiments.runner import SimConfig

    base = "edf-swap" if system == "edf-swap-edf" else system
    sim, cluster = Run("W_B", base, rt_share, rate, 40.0, 0, sweep="queue").config()
    if system == "edf-swap-edf":  # EDF inside the replica too, no eviction
        sim["policy"], sim["policy_params"] = "qlm", {"evict": False}
    sim["instance"] = {"max_running": r_max}
    sim["workload"]["slo"] = {"rt": {"deadline_s": rt_deadline}, "be": {"deadline_s": 300.0}}
    if prof is not None:
        cluster["replicas"] = [{"count": 2, "profile": prof}]
    s = simulate_cluster(
        SimConfig.model_validate(sim), ClusterConfig.load(cluster, "qlm eviction point"), None
    ).summary
    return {
        "attainment": s["deadline_attainment"],
        "rt": (s["deadline_attainment_by_class"] or {}).get("rt", 0.0),
        "tokens_per_s": s["throughput_tokens_per_s"],
        "preemptions": s["preemptions"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", default="", help="run the points whose label contains this")
    args = ap.parse_args()
    for label, rate, rt, r_max, dl, prof in POINTS:
        if args.only not in label:
            continue
        cells = []
        for system in SYSTEMS:
            r = run_point(system, rate, rt, r_max, dl, prof)
            cells.append(
                f"{system} {r['attainment']:.3f} (rt {r['rt']:.3f}) {r['tokens_per_s']:.0f} tok/s"
                f" pre {r['preemptions']}"
            )
        cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        print(f"{label}: " + " | ".join(cells) + f"  [CPU so far {cpu:.1f} s]", flush=True)


if __name__ == "__main__":
    main()
