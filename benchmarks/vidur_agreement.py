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
- ``worker`` (run by the Vidur interpreter, not by hand).

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
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_VIDUR_PYTHON = os.environ.get("VIDUR_PYTHON", "/work/vidur-venv/bin/python")
DEFAULT_PROFILING = Path("/work/shared/vidur-profiling")
DEFAULT_CACHE = Path.home() / ".cache" / "sloserve-bench" / "vidur"

VIDUR_MODEL = "meta-llama/Llama-2-70b-hf"
VIDUR_DEVICE = "a100"
VIDUR_NETWORK = "a100_pairwise_nvlink"
TP = 2
CV_FOLDS = 3
PROFILE = "llama-2-70b-a100x2"
MAX_TOKENS = 4096  # Llama-2's context: Vidur's request cap and prediction range

METRICS = ("ttft_p50", "ttft_p90", "tpot_mean", "tpot_p90", "e2e_p50", "e2e_p90")
"""The agreement metrics, in table order."""


# ----------------------------------------------------------------------- profiling tree


def layout_profiling(profiling: Path, cache_dir: Path) -> Path:
    """Vidur's ``data/profiling`` tree for Llama-2-70B/A100/TP2 under ``cache_dir``
    (symlinks into ``profiling``); returns its root. Only this model has an attention
    table (``attention_tp2_2024-05.csv``), so it is the only one laid out."""
    root = cache_dir / "data" / "profiling"
    compute = root / "compute" / VIDUR_DEVICE / VIDUR_MODEL
    network = root / "network" / VIDUR_NETWORK
    links = {
        compute / "mlp.csv": profiling / "compute" / VIDUR_DEVICE / VIDUR_MODEL / "mlp.csv",
        compute / "attention.csv": profiling
        / "compute"
        / VIDUR_DEVICE
        / VIDUR_MODEL
        / "attention_tp2_2024-05.csv",
        network / "all_reduce.csv": profiling / "network" / VIDUR_NETWORK / "all_reduce.csv",
        network / "send_recv.csv": profiling / "network" / VIDUR_NETWORK / "send_recv.csv",
    }
    for dst, src in links.items():
        if not src.is_file():
            raise SystemExit(f"vidur_agreement: missing profiling table {src}")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        dst.symlink_to(src)
    return root


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setting:
    """One Vidur/sloserve pair of runs."""

    scheduler: str  # "vllm" or "sarathi"
    qps: float
    num_requests: int
    replicas: int = 1
    router: str = "round_robin"  # Vidur's global scheduler: round_robin or lor
    seed: int = 42
    vidur_overheads: bool = True
    """False: Vidur without its two unmeasured additions (0.02 ms CPU launch overhead per
    all-reduce, +10% decode attention for GQA batches): an ablation, not Vidur's default."""

    @property
    def name(self) -> str:
        r = f"-{self.replicas}x{self.router}" if self.replicas > 1 else ""
        o = "" if self.vidur_overheads else "-nooverheads"
        return f"{self.scheduler}-qps{self.qps:g}-n{self.num_requests}{r}{o}"


# ------------------------------------------------------------------------ Vidur's side


def _vidur_args(s: Setting, trace_csv: Path, out_dir: Path, cache_dir: Path) -> list[str]:
    pre = "random_forrest_execution_time_predictor_config_"
    args = [
        "--seed", str(s.seed),
        "--log_level", "warning",
        "--replica_config_model_name", VIDUR_MODEL,
        "--replica_config_device", VIDUR_DEVICE,
        "--replica_config_network_device", VIDUR_NETWORK,
        "--replica_config_tensor_parallel_size", str(TP),
        "--replica_config_num_pipeline_stages", "1",
        "--cluster_config_num_replicas", str(s.replicas),
        "--global_scheduler_config_type", s.router,
        "--replica_scheduler_config_type", s.scheduler,
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(trace_csv),
        "--trace_request_generator_config_date", "2023-08-21",
        "--trace_request_generator_config_prefill_scale_factor", "1",
        "--trace_request_generator_config_decode_scale_factor", "1",
        "--trace_request_generator_config_time_scale_factor", "1",
        "--trace_request_generator_config_max_tokens", str(MAX_TOKENS),
        "--execution_time_predictor_config_type", "random_forrest",
        f"--{pre}cache_dir", str(cache_dir / "predictor"),
        f"--{pre}model_profiling_dataset", f"local/{VIDUR_DEVICE}/{VIDUR_MODEL}",
        f"--{pre}network_profiling_dataset", f"local/{VIDUR_NETWORK}",
        f"--{pre}prediction_max_tokens_per_request", str(MAX_TOKENS),
        # Training time on the shared 2-core machine (load 7-14): 3-fold instead of 10-fold
        # grid-search CV, and the grid narrowed from 27 to 2 points, to what Vidur's full
        # grid chose for the first five operators here (min_samples_split 2 every time,
        # depth 16 or 32, 250-500 trees). Same estimator family, same features.
        f"--{pre}k_fold_cv_splits", str(CV_FOLDS),
        f"--{pre}num_estimators", "250",
        f"--{pre}max_depth", "16", "32",
        f"--{pre}min_samples_split", "2",
        "--metrics_config_output_dir", str(out_dir),
        "--no-metrics_config_store_plots",
        "--no-metrics_config_enable_chrome_trace",
        "--no-metrics_config_store_utilization_metrics",
        "--metrics_config_keep_individual_batch_metrics",
    ]  # fmt: skip
    if not s.vidur_overheads:
        args += [
            f"--{pre}nccl_cpu_launch_overhead_ms", "0",
            f"--{pre}attention_decode_batching_overhead_fraction", "0",
        ]  # fmt: skip
    if s.scheduler == "vllm":
        args += [
            "--vllm_scheduler_config_batch_size_cap", "128",
            "--vllm_scheduler_config_max_tokens_in_batch", "4096",
        ]  # fmt: skip
    elif s.scheduler == "sarathi":
        args += [
            "--sarathi_scheduler_config_batch_size_cap", "128",
            "--sarathi_scheduler_config_chunk_size", "512",
        ]  # fmt: skip
    return args


def _worker_generate(spec: dict[str, Any]) -> None:
    """(Vidur interpreter) Vidur's synthetic generator → Vidur's trace-replay CSV."""
    from vidur.config import (
        PoissonRequestIntervalGeneratorConfig,
        SyntheticRequestGeneratorConfig,
        ZipfRequestLengthGeneratorConfig,
    )
    from vidur.request_generator.synthetic_request_generator import SyntheticRequestGenerator

    cfg = SyntheticRequestGeneratorConfig(
        seed=spec["seed"],
        max_tokens=MAX_TOKENS,
        num_requests=spec["num_requests"],
        length_generator_config=ZipfRequestLengthGeneratorConfig(
            seed=spec["seed"],
            theta=spec["zipf_theta"],
            min_tokens=spec["min_tokens"],
            max_tokens=MAX_TOKENS,
            prefill_to_decode_ratio=spec["pd_ratio"],
        ),
        interval_generator_config=PoissonRequestIntervalGeneratorConfig(
            seed=spec["seed"], qps=spec["qps"]
        ),
    )
    reqs = SyntheticRequestGenerator(cfg).generate()
    with open(spec["trace_csv"], "w") as f:
        f.write("Date,Time,PromptTokenCount,CompletionTokenCount\n")
        for r in reqs:
            f.write(f"2023-08-21,{r.arrived_at!r},{r.num_prefill_tokens},{r.num_decode_tokens}\n")


def _worker_simulate(spec: dict[str, Any]) -> None:
    """(Vidur interpreter) One Vidur run on a request CSV, reading the local profiling
    tree; logs every batch's composition and predicted time to ``batches.csv`` and each
    request's replica to ``replicas.csv``."""
    import sys as _sys

    from vidur.config import SimulationConfig
    from vidur.execution_time_predictor import sklearn_execution_time_predictor as skl
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    root = Path(spec["profiling_root"])
    files = (
        str(root / "compute" / VIDUR_DEVICE / VIDUR_MODEL / "mlp.csv"),
        str(root / "compute" / VIDUR_DEVICE / VIDUR_MODEL / "attention.csv"),
        str(root / "network" / VIDUR_NETWORK / "all_reduce.csv"),
        str(root / "network" / VIDUR_NETWORK / "send_recv.csv"),
    )

    def local_files(self: Any) -> tuple[str, ...]:
        return files

    def no_hf(self: Any) -> bool:
        raise RuntimeError("offline: predictions are trained locally")

    # Vidur 0.0.26 bug: Request.restart() (a recompute preemption) resets the processed
    # tokens but not the pipeline-stage counters added for sequence pipeline parallelism,
    # so the first batch after a restart fails ``assert _num_stage_processed_tokens <=
    # total_tokens``. Reset them too, as restart() does for everything else (with one
    # pipeline stage they mirror the processed tokens).
    from vidur.entities.request import Request as VRequest

    restart = VRequest.restart

    def restart_fixed(self: Any) -> None:
        restart(self)
        self._num_stage_processed_tokens = 0
        self._is_prefill_stage_complete = False

    VRequest.restart = restart_fixed  # type: ignore[method-assign]

    cls = skl.SklearnExecutionTimePredictor
    cls._get_input_files = local_files  # type: ignore[method-assign]
    cls._load_predictions_from_hf = no_hf  # type: ignore[method-assign]

    batch_rows: list[str] = []
    inner = cls.get_execution_time

    def logged(self: Any, batch: Any, stage: int) -> Any:
        et = inner(self, batch, stage)
        n_dec = 0
        kv_dec = 0
        chunks = []
        for q, kv in zip(batch.num_q_tokens, batch.num_kv_tokens, strict=True):
            if q == 1:
                n_dec += 1
                kv_dec += kv
            else:
                chunks.append(f"{q}:{kv}")
        batch_rows.append(
            f"{batch.replica_id.id},{n_dec},{kv_dec},{'|'.join(chunks)},"
            f"{et.total_time!r},{self._get_tensor_parallel_communication_time(batch)!r},"
            f"{self._get_attention_decode_execution_time(batch)!r},"
            f"{self._get_attention_prefill_execution_time(batch)!r}"
        )
        return et

    cls.get_execution_time = logged  # type: ignore[method-assign]

    out = Path(spec["out_dir"])
    _sys.argv = ["vidur", *spec["args"]]
    config = SimulationConfig.create_from_cli_args()
    set_seeds(config.seed)
    sim = Simulator(config)
    sim.run()
    if spec.get("train_only"):
        return
    run_dir = Path(config.metrics_config.output_dir)
    meta = {
        "num_blocks": config.cluster_config.cache_config.num_blocks,
        "block_size": config.cluster_config.cache_config.block_size,
        "watermark_blocks_fraction": config.cluster_config.cache_config.watermark_blocks_fraction,
    }
    (out / "vidur_meta.json").write_text(json.dumps(meta))
    shutil.copy(run_dir / "request_metrics.csv", out / "request_metrics.csv")
    if (run_dir / "batch_metrics.csv").exists():
        shutil.copy(run_dir / "batch_metrics.csv", out / "batch_metrics.csv")
    with open(out / "batches.csv", "w") as f:
        f.write(
            "replica,num_decode,decode_kv_sum,prefill_chunks,total_time_s,"
            "tp_comm_ms_per_allreduce,attn_decode_ms_per_layer,attn_prefill_ms_per_layer\n"
        )
        f.write("\n".join(batch_rows) + "\n")
    shutil.rmtree(run_dir, ignore_errors=True)


def _run_worker(argv: Sequence[str]) -> None:
    spec = json.loads(Path(argv[0]).read_text())
    if spec["kind"] == "generate":
        _worker_generate(spec)
    else:
        _worker_simulate(spec)


def call_vidur(vidur_python: str, spec: dict[str, Any], work: Path) -> None:
    """Runs one worker job in Vidur's interpreter (offline, from ``work``)."""
    work.mkdir(parents=True, exist_ok=True)
    spec_file = work / f"spec-{spec['kind']}.json"
    spec_file.write_text(json.dumps(spec))
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="disabled", PYTHONPATH="")
    cmd = [vidur_python, str(Path(__file__).resolve()), "worker", str(spec_file)]
    subprocess.run(cmd, cwd=work, env=env, check=True)


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
        if chunks and nd:
            key = "mixed"
        elif chunks:
            key = "prefill only"
        else:
            lo, hi = next((lo, hi) for lo, hi in BATCH_BINS if lo <= nd <= hi)
            key = f"decode {lo}-{hi}"
        vidur_comm = 2 * n_layers * b["vidur_ar_ms"] * 1e-3
        vidur_dec = n_layers * b["vidur_attn_dec_ms"] * 1e-3
        groups.setdefault(key, []).append(
            (b["vidur_s"], ours, vidur_comm, our_comm, vidur_dec, our_dec)
        )
    order = [f"decode {lo}-{hi}" for lo, hi in BATCH_BINS] + ["prefill only", "mixed"]
    lines = [
        f"Per-batch times, sloserve ({profile}) on Vidur's batches in {run_dir}",
        "",
        "| batches | n | Vidur ms | ours ms | ours/Vidur | Vidur all-reduce ms | ours |"
        " Vidur decode attn ms | ours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in order:
        rows = groups.get(key)
        if not rows:
            continue
        n = len(rows)
        mean = [sum(r[i] for r in rows) / n * 1e3 for i in range(6)]
        ratio = sum(r[1] for r in rows) / sum(r[0] for r in rows)
        lines.append(
            f"| {key} | {n} | {mean[0]:.2f} | {mean[1]:.2f} | {ratio:.3f} | {mean[2]:.2f} |"
            f" {mean[3]:.2f} | {mean[4]:.2f} | {mean[5]:.2f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------- main


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vidur-python", default=DEFAULT_VIDUR_PYTHON)
    p.add_argument("--profiling", type=Path, default=DEFAULT_PROFILING)
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)


def generate_spec(s: Setting, trace_csv: Path, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "kind": "generate",
        "seed": s.seed,
        "num_requests": s.num_requests,
        "qps": s.qps,
        "zipf_theta": args.zipf_theta,
        "min_tokens": args.min_tokens,
        "pd_ratio": args.pd_ratio,
        "trace_csv": str(trace_csv),
    }


def run_vidur(s: Setting, out: Path, args: argparse.Namespace, *, train_only: bool = False) -> None:
    """Vidur's request CSV for ``s`` (generated once) and Vidur's run on it, in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    root = layout_profiling(args.profiling, args.cache_dir)
    trace_csv = out / "requests.csv"
    if not trace_csv.exists():
        call_vidur(args.vidur_python, generate_spec(s, trace_csv, args), out)
    spec = {
        "kind": "simulate",
        "profiling_root": str(root),
        "out_dir": str(out),
        "train_only": train_only,
        "args": _vidur_args(s, trace_csv, out / "vidur_output", args.cache_dir),
    }
    call_vidur(args.vidur_python, spec, out)


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
