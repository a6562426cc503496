"""How far the InferMax CSP (``sloserve.optimal.infermax``) solves exactly: solve time and gap
against the number of requests N and the number of batches J.

Instances: N identical offline requests with input ``--input`` (16) and output O, KV
capacity M = max(2I, I+O-1) tokens (InferMax §4.5's contention: two prompts fit, only one
request can keep its KV to its last token), C = P = 4096, Llama-2-7B/A100 profile. The
number of batches J is the warm start's (the best of vllm, vllm-ef, sarathi, sarathi-ef),
so J grows with N·O. Each configuration is solved once with the wall-clock limit
``--time-limit`` (60 s) and ``--workers`` CP-SAT workers (1 by default: the machine is
shared). One JSON line per configuration: N, O, J, variables, constraints, status, solve
seconds, gap, the optimum (or best found) total latency, the warm start's, the improvement
over it and the evictions.

    python benchmarks/csp_scaling.py [--requests 2,3,4,6,8] [--outputs 4,8,16]
"""

from __future__ import annotations

import argparse
import json

from sloserve.costmodel.profile import load_profile
from sloserve.engine.interface import Limits
from sloserve.optimal.infermax import CspOptions, solve, uniform_jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", default="2,3,4,6,8")
    ap.add_argument("--outputs", default="4,8,16")
    ap.add_argument("--input", type=int, default=16)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--profile", default="llama-2-7b-a100")
    args = ap.parse_args()
    cm = load_profile(args.profile).cost_model()
    inp = args.input
    for n in (int(x) for x in args.requests.split(",")):
        for o in (int(x) for x in args.outputs.split(",")):
            limits = Limits(4096, 4096, max(2 * inp, inp + o - 1), 256, 1)
            res = solve(
                uniform_jobs(n, inp, o),
                limits,
                cm,
                CspOptions(time_limit_s=args.time_limit, workers=args.workers),
            )
            ws = res.baselines[res.warm_start] if res.warm_start else None
            ws_lat = ws.evaluation.total_latency if ws and ws.evaluation else None
            lat = res.latency
            row = {
                "N": n,
                "I": inp,
                "O": o,
                "M": limits.kv_capacity_tokens,
                "J": res.num_batches_limit,
                "variables": res.stats["variables"],
                "constraints": res.stats["constraints"],
                "status": res.status,
                "solve_s": round(res.solve_seconds, 2),
                "gap": None if res.gap is None else round(res.gap, 4),
                "latency": lat,
                "warm_start": res.warm_start,
                "warm_start_latency": ws_lat,
                "improvement_pct": (
                    round((ws_lat - lat) / ws_lat * 100, 2) if lat is not None and ws_lat else None
                ),
                "evictions": res.evictions,
                "batches_used": res.schedule.num_batches if res.schedule else None,
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
