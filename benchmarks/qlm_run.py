"""QLM's simulation speed: one W_A run (multi-model, half latency-sensitive, a tail model
no replica serves at first) of ``--requests`` requests over ``--replicas`` replicas, at
W_A's load per replica (the reproduction's 14 req/s on two replicas, scaled), with the
router ``qlm`` and the policy ``qlm``. The issue's target: 50,000 requests over 16
instances in under 30 s. Prints wall and process CPU seconds (the machine is shared:
CPU seconds are the steadier number) and the run's QLM counters.

    python benchmarks/qlm_run.py                      # 50,000 requests, 16 replicas
    python benchmarks/qlm_run.py --requests 5000 --replicas 4 --router edf
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--rate-per-replica", type=float, default=7.0, help="req/s per replica")
    ap.add_argument("--router", default="qlm")
    args = ap.parse_args()
    import sloserve
    cfg, cluster = wa_config(args.requests, args.replicas, args.rate_per_replica, args.router)
    w0, c0 = time.perf_counter(), time.process_time()
    s = sloserve.simulate(cfg, cluster=cluster).summary
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    q = s.get("qlm") or {}
    print(
        f"W_A run ({args.router}): {s['requests']} requests, {s['finished']} finished, on "
        f"{args.replicas} replicas: wall {wall:.1f} s, CPU {cpu:.1f} s (load average "
        f"{os.getloadavg()[0]:.2f}); attainment {s['deadline_attainment']:.3f}, "
        f"{s['throughput_tokens_per_s']:.0f} tokens/s, plan calls {q.get('plan_calls', 0)}, "
        f"solve {q.get('plan_solve_s_total', 0.0):.2f} s, model loads "
        f"{s.get('model_loads_by_tier')}"
    )


def wa_config(
    requests: int, replicas: int, rate_per_replica: float, router: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """W_A at this scale: the (config, cluster) mappings for ``sloserve.simulate``; half
    the replicas start on Llama-2-7B, half on Phi-2, Llama-3-8B is the tail model."""
    from sloserve.experiments.qlm.plan import TAIL_SHARE

    rest = 1.0 - TAIL_SHARE
    cfg = {
        "workload": {
            "arrival": {"kind": "poisson", "rate": rate_per_replica * replicas},
            "num_requests": requests,
            "duration_s": None,
            "slo": "qlm",
            "classes": {"rt": 0.5, "be": 0.5},
            "models": {
                "llama-2-7b": rest * 4 / 7,
                "phi-2": rest * 3 / 7,
                "llama-3-8b": TAIL_SHARE,
            },
        },
        "policy": "qlm" if router == "qlm" else "vllm",
    }
    half = replicas // 2
    cluster = {
        "replicas": [
            {"count": half, "profile": "llama-2-7b-a100"},
            {"count": replicas - half, "profile": "phi-2-a100"},
        ],
        "models": {"llama-3-8b": {"profile": "llama-3-8b-a100"}},
        "router": router,
    }
    return cfg, cluster


if __name__ == "__main__":
    main()
