"""Agreement with Vidur: the same requests through Vidur and through sloserve, metric by metric.

Vidur (microsoft/vidur) is installed in its own virtual environment, never in the project's:

```bash
python3 -m venv /work/vidur-venv && /work/vidur-venv/bin/pip install vidur==0.0.26
```

(``--vidur-python`` points at another interpreter; the default is
``$VIDUR_PYTHON`` or ``/work/vidur-venv/bin/python``.) The wheel ships Vidur's code but no
profiling data, and 0.0.26 downloads its operator tables from HuggingFace: this script
lays the tables of ``/work/shared/vidur-profiling`` (``--profiling``) out under its cache
directory in Vidur's classic tree (``data/profiling/compute/a100/<model>/{mlp,attention}.csv``,
``data/profiling/network/a100_pairwise_nvlink/{all_reduce,send_recv}.csv``) and makes
Vidur's predictor read them from there instead of the network (it patches the predictor's
``_get_input_files``, and ``_load_predictions_from_hf`` to fail at once). Only Llama-2-70B
at TP2 on A100 has an attention table, so that is the only setting Vidur can run here.

Vidur's first run trains its random-forest predictors (tens of minutes on two cores); the
trained models and their prediction tables are cached under
``~/.cache/sloserve-bench/vidur`` (``--cache-dir``), never in the repository. Start it once
with ``python benchmarks/vidur_agreement.py train`` (it runs a tiny workload).

Subcommands:

- ``run``: for each scheduler × load (× router with ``--replicas``), draws the requests
  with Vidur's own synthetic generator (Poisson arrivals, Zipf lengths), writes them as
  Vidur's trace-replay request CSV, runs Vidur on that CSV and sloserve on the very same
  requests (the ``llama-2-70b-a100x2`` profile, fitted to the same tables; the KV capacity
  Vidur computes), and prints one table per setting: TTFT p50/p90, TPOT mean/p90 and e2e
  p50/p90 with the relative difference (sloserve vs Vidur), plus batch and restart counts.
- ``compare --from-results DIR``: the same tables from results already written by ``run``
  (Vidur's ``request_metrics.csv`` and sloserve's ``sloserve_requests.csv`` per setting):
  the comparison code without running anything.
- ``batches --from-results DIR``: prices every batch Vidur ran (its compositions, logged
  by the worker) with sloserve's cost model and compares per-batch times by batch kind and
  size, all-reduce included.
- ``worker SPEC.json``: what Vidur's interpreter runs (``vidur_worker.py``, the Vidur
  side: profiling tree, Vidur's command line, the request generator, the batch log).

Options of ``run`` for the root-cause analysis (docs/fidelity.md): ``--vidur-no-overheads``
(Vidur without its two unmeasured additions), ``--scale-cost K`` (sloserve's batch times
× K), ``--profile`` (another sloserve profile, e.g. the one before a change), and
``--skip-vidur`` (reuse Vidur's results already in ``--out``).

Metrics (both sides in seconds): TTFT = first token − arrival (Vidur's
``prefill_e2e_time``); e2e = completion − arrival (``request_e2e_time``); TPOT is reported
both ways: Vidur's definition, (completion − prefill completion) / decode tokens
(``decode_time_execution_plus_preemption_normalized``), which the agreement table uses for
both simulators, and sloserve's own, (t_last − t_first) / (n − 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vidur_worker import (
    DEFAULT_CACHE,
    DEFAULT_PROFILING,
    DEFAULT_VIDUR_PYTHON,
    METRICS,
    PROFILE,
    Setting,
    _run_worker,
    run_vidur,
)

# --------------------------------------------------------------------- sloserve's side


def read_request_csv(path: Path) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, decode tokens) per row of Vidur's trace-replay CSV, in
    order (Vidur numbers the requests 0, 1, … in this order)."""
    import csv

    with open(path, newline="") as f:
        return [
            (float(r["Time"]), int(r["PromptTokenCount"]), int(r["CompletionTokenCount"]))
            for r in csv.DictReader(f)
        ]


SLOSERVE_ROUTER = {"round_robin": "round-robin", "lor": "vidur-lor"}
"""Vidur's global scheduler → the sloserve router with the same semantics."""


def scaled_profile(profile: str, factor: float, out: Path) -> str:
    """A copy of ``profile`` with every batch-time coefficient × ``factor``, written to
    ``out`` (a sensitivity check: how much of a gap a uniform per-batch difference
    explains); returns its path."""
    import yaml

    from sloserve.costmodel.profile import load_profile

    prof = load_profile(profile)
    coef = {k: v * factor for k, v in prof.coefficients.model_dump().items()}
    data = prof.model_dump(mode="json")
    data["coefficients"] = coef
    data["name"] = f"{prof.name}-x{factor:g}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def run_sloserve(s: Setting, out: Path, profile: str, kv_capacity_tokens: int) -> dict[str, Any]:
    """sloserve on ``out/requests.csv``: writes ``sloserve_requests.csv`` (per request:
    arrival, ttft, e2e, both TPOTs, preemptions, replica) and returns the run's summary."""
    import time

    import pandas as pd

    from sloserve.api import simulate
    from sloserve.core.request import Request

    # Vidur's decode tokens include the token its prefill produces: D output tokens.
    reqs = [
        Request(req_id=i, arrival=t, num_prompt_tokens=p, true_output_len=d)
        for i, (t, p, d) in enumerate(read_request_csv(out / "requests.csv"))
    ]
    instance: dict[str, Any] = {
        "profile": profile,
        "max_running": 128,
        "block_size": 16,
        "kv_capacity_tokens": kv_capacity_tokens,
        "prefix_caching": False,  # Vidur's requests share nothing
        "cpu_swap_gib": 0.0,
    }
    if s.scheduler == "vllm":
        instance["max_batch_tokens"] = 4096
    else:  # Vidur's Sarathi: chunk_size is the whole token budget, decodes included
        instance["max_batch_tokens"] = 512
        instance["chunk_size"] = 512
    cfg: dict[str, Any] = {"instance": instance, "policy": s.scheduler}
    if s.replicas > 1:
        cfg["cluster"] = {
            "replicas": [{"count": s.replicas}],
            "router": SLOSERVE_ROUTER[s.router],
        }
    t0 = time.process_time()
    res = simulate(cfg, reqs)
    cpu = time.process_time() - t0
    tab = res.table.sort_values("req_id")
    frame = pd.DataFrame(
        {
            "req_id": tab["req_id"].to_numpy(),
            "arrival_s": tab["arrival_s"].to_numpy(),
            "ttft_s": tab["ttft_s"].to_numpy(),
            "e2e_s": tab["e2e_s"].to_numpy(),
            "tpot_own_s": tab["tpot_s"].to_numpy(),
            # Vidur's: (completion − prefill completion) / decode tokens
            "tpot_vidur_s": ((tab["e2e_s"] - tab["ttft_s"]) / tab["output_tokens"]).to_numpy(),
            "preemptions": tab["preemptions"].to_numpy(),
            "replica": tab["instance"].to_numpy(),
        }
    )
    frame.to_csv(out / "sloserve_requests.csv", index=False)
    summary = {
        "iterations": int(res.summary["iterations"]),
        "preemptions": int(res.summary["preemptions"]),
        "finished": int(res.summary["finished"]),
        "cpu_s": round(cpu, 2),
        "profile": profile,
        "kv_capacity_tokens": kv_capacity_tokens,
    }
    (out / "sloserve_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


# -------------------------------------------------------------------------- comparison


def _pct(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation, as numpy's default."""
    xs = sorted(v for v in values if v == v)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float:
    xs = [v for v in values if v == v]
    return sum(xs) / len(xs) if xs else float("nan")


def metrics_of(
    ttft: Sequence[float], tpot: Sequence[float], e2e: Sequence[float]
) -> dict[str, float]:
    """The agreement metrics (:data:`METRICS`), in seconds."""
    return {
        "ttft_p50": _pct(ttft, 0.5),
        "ttft_p90": _pct(ttft, 0.9),
        "tpot_mean": _mean(tpot),
        "tpot_p90": _pct(tpot, 0.9),
        "e2e_p50": _pct(e2e, 0.5),
        "e2e_p90": _pct(e2e, 0.9),
    }


VIDUR_COLUMNS = {
    "id": "Request Id",
    "ttft": "prefill_e2e_time",
    "e2e": "request_e2e_time",
    "tpot": "decode_time_execution_plus_preemption_normalized",
    "restarts": "request_num_restarts",
}
"""The columns of Vidur's ``request_metrics.csv`` the comparison reads (times in s)."""


@dataclass
class SideResult:
    """One simulator's per-request results, aligned by request id."""

    metrics: dict[str, float]
    requests: int
    restarts: int
    batches: int | None
    extra: dict[str, float]


def read_vidur(run_dir: Path) -> SideResult:
    """Vidur's results in ``run_dir`` (``request_metrics.csv``; ``batches.csv`` if present)."""
    import csv

    with open(run_dir / "request_metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [c for c in VIDUR_COLUMNS.values() if rows and c not in rows[0]]
    if missing:
        raise SystemExit(f"{run_dir / 'request_metrics.csv'}: missing column(s) {missing}")
    col = VIDUR_COLUMNS
    ttft = [float(r[col["ttft"]]) for r in rows]
    tpot = [float(r[col["tpot"]]) for r in rows]
    e2e = [float(r[col["e2e"]]) for r in rows]
    restarts = sum(int(float(r[col["restarts"]] or 0)) for r in rows)
    batches = None
    if (run_dir / "batches.csv").exists():
        with open(run_dir / "batches.csv") as f:
            batches = sum(1 for _ in f) - 1
    return SideResult(metrics_of(ttft, tpot, e2e), len(rows), restarts, batches, {})


def read_sloserve(run_dir: Path) -> SideResult:
    """sloserve's results in ``run_dir`` (``sloserve_requests.csv``, its summary)."""
    import csv

    with open(run_dir / "sloserve_requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    ttft = [float(r["ttft_s"]) for r in rows]
    e2e = [float(r["e2e_s"]) for r in rows]
    tpot_v = [float(r["tpot_vidur_s"]) for r in rows]
    tpot_o = [float(r["tpot_own_s"]) for r in rows]
    summary: dict[str, Any] = {}
    if (run_dir / "sloserve_summary.json").exists():
        summary = json.loads((run_dir / "sloserve_summary.json").read_text())
    restarts = sum(int(float(r["preemptions"])) for r in rows)
    return SideResult(
        metrics_of(ttft, tpot_v, e2e),
        len(rows),
        restarts,
        summary.get("iterations"),
        {"tpot_own_mean": _mean(tpot_o)},
    )


def rel_diff(ours: float, theirs: float) -> float:
    """(ours − theirs) / theirs; nan when undefined."""
    if not (theirs == theirs and ours == ours) or theirs == 0:
        return float("nan")
    return (ours - theirs) / theirs


def compare_dir(run_dir: Path) -> dict[str, Any]:
    """Vidur vs sloserve for one setting's directory: every metric with its relative
    difference, plus request, restart and batch counts."""
    v = read_vidur(run_dir)
    o = read_sloserve(run_dir)
    if v.requests != o.requests:
        raise SystemExit(
            f"{run_dir}: Vidur has {v.requests} requests, sloserve {o.requests}: not the same run"
        )
    return {
        "setting": run_dir.name,
        "requests": v.requests,
        "metrics": {
            m: {
                "vidur": v.metrics[m],
                "sloserve": o.metrics[m],
                "diff": rel_diff(o.metrics[m], v.metrics[m]),
            }
            for m in METRICS
        },
        "restarts": {"vidur": v.restarts, "sloserve": o.restarts},
        "batches": {"vidur": v.batches, "sloserve": o.batches},
        "tpot_own_mean": o.extra.get("tpot_own_mean"),
    }


def format_table(cmp: dict[str, Any]) -> str:
    """One setting's comparison as a Markdown table."""
    lines = [
        f"### {cmp['setting']} ({cmp['requests']} requests)",
        "",
        "| metric | Vidur | sloserve | difference |",
        "|---|---|---|---|",
    ]
    for m in METRICS:
        d = cmp["metrics"][m]
        unit, k = ("ms", 1e3) if m.startswith("tpot") else ("s", 1.0)
        flag = " **" if abs(d["diff"]) > 0.05 else ""
        lines.append(
            f"| {m} | {d['vidur'] * k:.4g} {unit} | {d['sloserve'] * k:.4g} {unit} |"
            f"{flag} {d['diff'] * 100:+.1f}%{flag.strip() and '**'} |"
        )
    r, b = cmp["restarts"], cmp["batches"]
    lines.append(f"| restarts | {r['vidur']} | {r['sloserve']} | |")
    if b["vidur"] is not None and b["sloserve"] is not None:
        db = rel_diff(b["sloserve"], b["vidur"]) * 100
        lines.append(f"| batches | {b['vidur']} | {b['sloserve']} | {db:+.1f}% |")
    if cmp.get("tpot_own_mean") is not None:
        lines.append(
            f"| sloserve TPOT mean, own definition | | {cmp['tpot_own_mean'] * 1e3:.4g} ms | |"
        )
    return "\n".join(lines)


def compare_results(root: Path) -> list[dict[str, Any]]:
    """Every setting directory under ``root`` (or ``root`` itself) that has both results."""
    dirs = [root] if (root / "request_metrics.csv").exists() else sorted(root.iterdir())
    out = []
    for d in dirs:
        if (d / "request_metrics.csv").exists() and (d / "sloserve_requests.csv").exists():
            out.append(compare_dir(d))
    if not out:
        raise SystemExit(
            f"{root}: no setting with both request_metrics.csv and sloserve_requests.csv"
        )
    return out


# ---------------------------------------------------------------- per-batch comparison

BATCH_BINS = ((1, 8), (9, 24), (25, 48), (49, 96), (97, 128))
"""Decode batch sizes the per-batch table groups by."""


def vidur_batches(run_dir: Path) -> list[dict[str, Any]]:
    """Every batch Vidur ran in ``run_dir`` (``batches.csv``, written by the worker):
    decodes, their KV sum, prefill chunks ``(tokens, kv incl. the chunk)``, Vidur's
    predicted time (s) and its per-all-reduce, per-layer attention times (ms)."""
    import csv

    out = []
    with open(run_dir / "batches.csv", newline="") as f:
        for r in csv.DictReader(f):
            chunks = [
                (int(q), int(kv))
                for q, kv in (c.split(":") for c in r["prefill_chunks"].split("|") if c)
            ]
            out.append(
                {
                    "num_decode": int(r["num_decode"]),
                    "decode_kv_sum": int(r["decode_kv_sum"]),
                    "chunks": chunks,
                    "vidur_s": float(r["total_time_s"]),
                    "vidur_ar_ms": float(r["tp_comm_ms_per_allreduce"]),
                    "vidur_attn_dec_ms": float(r["attn_decode_ms_per_layer"]),
                    "vidur_attn_pre_ms": float(r["attn_prefill_ms_per_layer"]),
                }
            )
    return out


def batch_report(run_dir: Path, profile: str) -> str:
    """sloserve's cost model on Vidur's own batches: mean time per batch kind and decode
    batch size, with the tensor-parallel all-reduce and decode attention split out."""
    from sloserve.costmodel.base import BatchStats
    from sloserve.costmodel.profile import load_profile

    prof = load_profile(profile)
    cm = prof.cost_model()
    c = cm.c
    n_layers = prof.model.num_layers
    groups: dict[str, list[tuple[float, ...]]] = {}
    for b in vidur_batches(run_dir):
        nd = b["num_decode"]
        chunks = b["chunks"]
        # Vidur's KV counts include the tokens being processed; ours is the context read.
        stats = BatchStats(
            num_prefill_tokens=sum(q for q, _ in chunks),
            num_prefill_seqs=len(chunks),
            prefill_attn_work=sum(q * kv for q, kv in chunks),
            num_decode=nd,
            decode_context_sum=b["decode_kv_sum"],
        )
        tokens = stats.total_tokens
        ours = cm.batch_time(stats)
        our_comm = c.comm_intercept + c.comm_per_token * tokens
        our_dec = (
            c.decode_intercept + c.per_decode_seq * nd + c.per_decode_kv * stats.decode_context_sum
            if nd
            else 0.0
        )
        our_pre = (
            c.prefill_intercept
            + c.per_prefill_seq * len(chunks)
            + c.per_prefill_work * stats.prefill_attn_work
            if chunks
            else 0.0
        )
        if chunks and nd:
            key = "mixed"
        elif chunks:
            key = "prefill only"
        else:
            lo, hi = next((lo, hi) for lo, hi in BATCH_BINS if lo <= nd <= hi)
            key = f"decode {lo}-{hi}"
        vidur_comm = 2 * n_layers * b["vidur_ar_ms"] * 1e-3
        vidur_dec = n_layers * b["vidur_attn_dec_ms"] * 1e-3
        vidur_pre = n_layers * b["vidur_attn_pre_ms"] * 1e-3
        groups.setdefault(key, []).append(
            (b["vidur_s"], ours, vidur_comm, our_comm, vidur_dec, our_dec, vidur_pre, our_pre)
        )
    order = [f"decode {lo}-{hi}" for lo, hi in BATCH_BINS] + ["prefill only", "mixed"]
    lines = [
        f"Per-batch times, sloserve ({profile}) on Vidur's batches in {run_dir}",
        "",
        "| batches | n | Vidur ms | ours ms | ours/Vidur | Vidur all-reduce ms | ours |"
        " Vidur decode attn ms | ours | Vidur prefill attn ms | ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in order:
        rows = groups.get(key)
        if not rows:
            continue
        n = len(rows)
        mean = [sum(r[i] for r in rows) / n * 1e3 for i in range(8)]
        ratio = sum(r[1] for r in rows) / sum(r[0] for r in rows)
        lines.append(
            f"| {key} | {n} | {mean[0]:.2f} | {mean[1]:.2f} | {ratio:.3f} | {mean[2]:.2f} |"
            f" {mean[3]:.2f} | {mean[4]:.2f} | {mean[5]:.2f} | {mean[6]:.2f} | {mean[7]:.2f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------- main


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vidur-python", default=DEFAULT_VIDUR_PYTHON)
    p.add_argument("--profiling", type=Path, default=DEFAULT_PROFILING)
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)


def _settings(args: argparse.Namespace) -> list[Setting]:
    out = []
    ov = not args.vidur_no_overheads
    for sched in args.schedulers:
        for qps in args.qps:
            if args.replicas > 1:
                out += [
                    Setting(sched, qps, args.num_requests, args.replicas, r, args.seed, ov)
                    for r in args.routers
                ]
            else:
                out.append(
                    Setting(sched, qps, args.num_requests, seed=args.seed, vidur_overheads=ov)
                )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        _run_worker(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="lay out the profiling tree and train Vidur's predictors")
    run = sub.add_parser("run", help="run Vidur and sloserve on the same requests, compare")
    for p in (tr, run):
        _common(p)
        p.add_argument("--zipf-theta", type=float, default=0.6, help="Vidur's Zipf lengths")
        p.add_argument("--min-tokens", type=int, default=256, help="shortest request (P + D)")
        p.add_argument("--pd-ratio", type=float, default=2.0, help="prompt : decode tokens")
    run.add_argument("--out", type=Path, required=True, help="results directory")
    run.add_argument("--schedulers", nargs="+", default=["vllm", "sarathi"])
    run.add_argument("--qps", nargs="+", type=float, default=[0.5, 1.0, 2.0])
    run.add_argument("--num-requests", type=int, default=2048)
    run.add_argument("--replicas", type=int, default=1)
    run.add_argument("--routers", nargs="+", default=["round_robin", "lor"])
    run.add_argument("--seed", type=int, default=42)
    run.add_argument("--profile", default=PROFILE, help="sloserve profile (name or YAML)")
    run.add_argument("--skip-vidur", action="store_true", help="reuse Vidur's results in --out")
    run.add_argument(
        "--scale-cost",
        type=float,
        default=None,
        help="sensitivity: sloserve's batch times × this factor (a scaled copy of --profile)",
    )
    run.add_argument(
        "--vidur-no-overheads",
        action="store_true",
        help="ablation: Vidur without its launch overhead and GQA decode-attention surcharge",
    )
    cmp = sub.add_parser("compare", help="compare results already written")
    cmp.add_argument("--from-results", type=Path, required=True, dest="from_results")
    cmp.add_argument("--json", action="store_true", help="print JSON instead of tables")
    bat = sub.add_parser("batches", help="sloserve's cost model on Vidur's batches")
    bat.add_argument("--from-results", type=Path, required=True, dest="from_results")
    bat.add_argument("--profile", default=PROFILE)
    args = ap.parse_args(argv)
    if args.cmd == "train":
        s = Setting("vllm", 1.0, 16)
        run_vidur(s, args.cache_dir / "train-run", args, train_only=True)
        print(f"Vidur predictors trained and cached under {args.cache_dir / 'predictor'}")
    elif args.cmd == "run":
        if args.scale_cost is not None:
            args.profile = scaled_profile(args.profile, args.scale_cost, args.out)
        for s in _settings(args):
            d = args.out / s.name
            if not args.skip_vidur or not (d / "request_metrics.csv").exists():
                run_vidur(s, d, args)
            meta = json.loads((d / "vidur_meta.json").read_text())
            run_sloserve(s, d, args.profile, int(meta["num_blocks"]) * int(meta["block_size"]))
            print(format_table(compare_dir(d)), "\n", flush=True)
    elif args.cmd == "compare":
        res = compare_results(args.from_results)
        if args.json:
            print(json.dumps(res, indent=1))
        else:
            print("\n\n".join(format_table(c) for c in res))
    elif args.cmd == "batches":
        print(batch_report(args.from_results, args.profile))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
