"""Prefix caching on Mooncake's conversation trace: the issue-17 reproduction and its cost.

Data: ``../shared/traces/mooncake_conversation_trace.jsonl`` (Mooncake, FAST '25,
Apache-2.0; 12,031 requests over one hour, mean prompt 12,035 tokens, ``hash_ids`` per
512-token block), replayed at its own pace on 16 replicas of Llama-3.1-8B (128k context)
on one H100 each (roofline profile ``llama-3.1-8b@h100``: 459,088 tokens of KV cache per
replica), Sarathi-Serve (chunked prefill, P = 512) on every replica.

Three parts (each prints JSON lines, then a markdown table):

* ``--table``: the settings of the issue — prefix caching off / on, the CPU tier off / on
  (``--cpu-gib`` per replica), and the routers round-robin, least-loaded,
  session-affinity, prefix-affinity and prefix-load — with hit rate, TTFT p50/p90, TPOT
  mean, throughput and SLO attainment (the trace's default SLOs).
* ``--speed``: wall time of the whole trace, caching off vs on (round-robin and
  prefix-affinity), the best of ``--repeat`` runs each (noise on a shared machine only
  ever adds time), and their ratio.
* ``--lookup``: one prefix lookup (``lookup_prefix`` + ``free``) against a cache holding
  the prompt, for prompts of 16 to 4,096 units: the cost per unit is flat (O(blocks of
  the prompt)).

    python benchmarks/prefix_caching.py --table --speed --lookup [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
CONV = TRACE / "mooncake_conversation_trace.jsonl"

SETTINGS: list[tuple[str, str, bool, float]] = [
    # (label, router, prefix caching, CPU tier GiB)
    ("caching off", "round-robin", False, 0.0),
    ("caching on", "round-robin", True, 0.0),
    ("caching on + CPU tier", "round-robin", True, -1.0),
    ("least-loaded", "least-loaded", True, 0.0),
    ("session-affinity", "session-affinity", True, 0.0),
    ("prefix-affinity", "prefix-affinity", True, 0.0),
    ("prefix-load", "prefix-load", True, 0.0),
    ("prefix-load + CPU tier", "prefix-load", True, -1.0),
]


def config(router: str, caching: bool, cpu_gib: float, replicas: int) -> dict[str, Any]:
    return {
        "workload": {"trace": str(CONV)},
        "policy": "sarathi",
        "instance": {
            "profile": "llama-3.1-8b@h100",
            "prefix_caching": caching,
            "cpu_cache_gib": cpu_gib,
        },
        "cluster": {"replicas": [{"count": replicas}], "router": router},
    }


def run_one(args: tuple[str, str, bool, float, int]) -> dict[str, Any]:
    import sloserve

    label, router, caching, cpu_gib, replicas = args
    t0 = time.perf_counter()
    s = sloserve.simulate(config(router, caching, cpu_gib, replicas)).summary
    return {
        "setting": label,
        "router": router,
        "prefix_caching": caching,
        "cpu_cache_gib": cpu_gib,
        "hit_rate": s["prefix_hit_rate"],
        "hit_rate_cpu": s["prefix_hit_tokens_cpu"] / max(1, s["prefix_lookup_tokens"]),
        "ttft_p50_s": s["ttft_p50"],
        "ttft_p90_s": s["ttft_p90"],
        "tpot_mean_ms": 1e3 * s["tpot_mean"],
        "throughput_tok_s": s["throughput_tokens_per_s"],
        "slo_attainment": s["slo_attainment"],
        "finished": s["finished"],
        "wall_s": time.perf_counter() - t0,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| setting | router | hit rate (CPU) | TTFT p50 s | TTFT p90 s | TPOT ms "
        "| tok/s | SLO att. |\n|---|---|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(
        f"| {r['setting']} | {r['router']} | {r['hit_rate']:.1%} ({r['hit_rate_cpu']:.1%}) "
        f"| {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} | {r['tpot_mean_ms']:.1f} "
        f"| {r['throughput_tok_s']:.0f} | {r['slo_attainment']:.1%} |"
        for r in rows
    )


def lookup_cost() -> list[dict[str, Any]]:
    from sloserve.core.request import Request
    from sloserve.engine.prefix_cache import PrefixCachingKVManager

    out = []
    for units in (16, 64, 256, 1024, 4096):
        kv = PrefixCachingKVManager(units * 32 + 64, 16)
        ids = tuple(range(units))
        first = Request(0, 0.0, units * 512 + 1, 1, hash_ids=ids)
        kv.lookup_prefix(first)
        kv.allocate(0, units * 512 + 1)
        kv.free(0)
        n = max(20, 20_000 // units)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for i in range(1, n + 1):
                r = Request(i, 0.0, units * 512 + 1, 1, hash_ids=ids)
                assert kv.lookup_prefix(r) == units * 512
                kv.free(i)
                kv.forget(i)
            best = min(best, (time.perf_counter() - t0) / n)
        out.append({"units": units, "lookup_us": 1e6 * best, "us_per_unit": 1e6 * best / units})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--lookup", action="store_true")
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--cpu-gib", type=float, default=64.0, help="CPU tier per replica")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    if not CONV.exists():
        sys.exit(f"no trace at {CONV}")
    if a.lookup:
        for row in lookup_cost():
            print(json.dumps(row))
    if a.speed:
        best: dict[tuple[str, bool], float] = {}
        for router in ("round-robin", "prefix-affinity"):
            for caching in (False, True):
                walls = [
                    run_one((router, router, caching, 0.0, a.replicas))["wall_s"]
                    for _ in range(a.repeat)
                ]
                best[router, caching] = min(walls)
                print(json.dumps({"router": router, "prefix_caching": caching, "walls": walls}))
        for router in ("round-robin", "prefix-affinity"):
            on, off = best[router, True], best[router, False]
            print(f"{router}: off {off:.2f} s, on {on:.2f} s, on/off = {on / off:.2f}")
    if a.table:
        jobs = [
            (label, router, caching, a.cpu_gib if cpu < 0 else cpu, a.replicas)
            for label, router, caching, cpu in SETTINGS
        ]
        with ProcessPoolExecutor(a.workers) as ex:
            rows = list(ex.map(run_one, jobs))
        for row in rows:
            print(json.dumps(row))
        print(table(rows))


if __name__ == "__main__":
    main()
