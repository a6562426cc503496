"""``sloserve reproduce infermax``: run a :class:`~sloserve.experiments.infermax.plan.Plan`
(simulations in parallel processes, then the §4.5 CSP sweep of
:mod:`sloserve.experiments.infermax.csp`) and write its data, headline, findings and plots.

Metrics of one run (choices where the paper is vague):

* **Latency** is the total latency (makespan: the last request's finish, all arriving at 0)
  and TPS = generated tokens / latency, as §4.1 defines them; TTFT and TPOT are means over
  requests (TPOT is undefined for O = 1 and left empty).
* **Running size** is the mean number of running requests per batch (weighted by
  iterations); the *steady* running size averages only the batches during which requests
  were still waiting, so that the ramp-down of the last wave does not dilute it. It is
  compared with ``min(B, R_max, M/(I+O))`` (the paper's effective running size).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.experiments.executor import Executor, as_executor
from sloserve.experiments.infermax.figures import plot
from sloserve.experiments.infermax.findings import findings_markdown, findings_table
from sloserve.experiments.infermax.headline import headline
from sloserve.experiments.infermax.plan import Plan, Run, Sim, plan_runs
from sloserve.experiments.report import jsonable
from sloserve.experiments.runner import simulate
from sloserve.policies.registry import make_policy


def _weighted_mean(values: pd.Series, weights: pd.Series) -> float:
    w = weights.to_numpy(dtype=np.float64)
    return float(np.dot(values.to_numpy(dtype=np.float64), w) / w.sum()) if w.sum() > 0 else 0.0


def execute(s: Sim) -> dict[str, Any]:
    """Simulate one :class:`Sim`; its metrics as a row."""
    t0 = time.perf_counter()
    res = simulate(s.config(), s.requests())
    summ, tab, tr = res.summary, res.table, res.trace
    latency = float(summ["simulated_seconds"])
    tokens = int(tab["generated_tokens"].sum())
    steady = tr[tr["waiting"] > 0] if len(tr) else tr
    nan = float("nan")

    def num(key: str) -> float:
        v = summ.get(key)
        return float(v) if v is not None else nan

    return {
        "requests": int(summ["requests"]),
        "finished": int(summ["finished"]),
        "rejected": int(summ["rejected"]),
        "latency_s": latency,
        "tps": tokens / latency if latency > 0 else nan,
        "ttft_mean_s": num("ttft_mean"),
        "tpot_mean_s": num("tpot_mean"),
        "e2e_mean_s": num("e2e_mean"),
        # Σ request latencies: the CSP's "total latency" objective (§4.5 compares on it)
        "latency_sum_s": float(tab["e2e_s"].sum()),
        "evictions": int(summ["preemptions"]),
        "running_mean": _weighted_mean(tr["running"], tr["steps"]) if len(tr) else nan,
        "running_steady": _weighted_mean(steady["running"], steady["steps"])
        if len(steady)
        else nan,
        "batch_size_mean": _weighted_mean(tr["batch_size"], tr["steps"]) if len(tr) else nan,
        "kv_usage_mean": _weighted_mean(tr["kv_usage"], tr["steps"]) if len(tr) else nan,
        "iterations": int(summ["iterations"]),
        "wall_s": time.perf_counter() - t0,
    }


def _row(run: Run, metrics: dict[str, Any]) -> dict[str, Any]:
    s = run.sim
    eff = min(s.b, s.rmax, s.m / (s.input_len + s.output_len)) if not s.mix else float("nan")
    pol = make_policy(s.policy, dict(s.params))
    p_tokens = min(pol.default_prefill_tokens or s.c, s.c)
    return {
        "analysis": run.analysis,
        "label": run.label,
        "policy": s.policy,
        "base": run.label.removesuffix("-ef"),
        "evicting": run.evicting,
        "I": s.input_len,
        "O": s.output_len,
        "mix": s.mix,
        "B": s.b,
        "M": s.m,
        "R_max": s.rmax,
        "P": p_tokens,
        "effective_running": eff,
        **metrics,
    }


@dataclass
class Reproduction:
    """What a reproduction produced: results (one row per run), the CSP sweep, headline."""

    results: pd.DataFrame
    csp: pd.DataFrame | None
    headline: dict[str, Any] = field(default_factory=dict)
    findings: pd.DataFrame = field(default_factory=pd.DataFrame)


CspSweep = Callable[..., pd.DataFrame]


def load_csp_sweep() -> tuple[CspSweep | None, str]:
    """The CSP engineer's sweep, or None and why not (the module may not exist yet)."""
    try:
        mod = importlib.import_module("sloserve.experiments.infermax.csp")
    except ImportError as e:
        return None, f"CSP sweep unavailable: {e}"
    fn = getattr(mod, "csp_eviction_sweep", None)
    if not callable(fn):
        return None, "CSP sweep unavailable: infermax.csp has no csp_eviction_sweep"
    return fn, ""


def _csp_extras(fn: CspSweep, workers: int, time_limit_s: float) -> dict[str, Any]:
    """Optional arguments of the sweep, passed where it accepts them: the forced-eviction
    solve (the best schedule that evicts, for §4.5's cost of evicting long inputs), and
    with one worker CP-SAT's load-independent limit, so that its rows repeat exactly."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    anykw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    out: dict[str, Any] = {}
    if anykw or "forced_eviction" in params:
        out["forced_eviction"] = True
    if workers == 1 and (anykw or "deterministic_limit" in params):
        out["deterministic_limit"] = time_limit_s
    return out


def reproduce(
    plan: Plan,
    out: str | Path,
    *,
    workers: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    csp_sweep: CspSweep | None = None,
    executor: Executor | str | None = None,
) -> Reproduction:
    """Run the plan (simulations on ``executor``: an
    :class:`~sloserve.experiments.executor.Executor` or its name, default local processes,
    ``workers`` of them), then the CSP sweep (here, on ``workers`` CP-SAT threads), and write
    ``results.parquet``, ``csp.parquet``, ``headline.json``, ``findings.md`` and the plots.

    ``csp_sweep`` replaces the CSP engineer's function (tests); ``progress(stage, done,
    total)`` is called as runs complete."""
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out_dir}: cannot create the output folder ({e.strerror})") from e
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    runs = plan_runs(plan)
    unique = list(dict.fromkeys(r.sim for r in runs))
    n_workers = workers or max(1, min(len(unique), os.cpu_count() or 1))
    cb = (lambda d, t: progress("simulating", d, t)) if progress else None
    ex, owned = as_executor(executor, n_workers)
    try:
        done = [0]

        def on_done(_k: int, _m: dict[str, Any]) -> None:
            done[0] += 1
            if cb:
                cb(done[0], len(unique))

        # the longest (largest B·(I+O)) first, so no worker is left with a tail of big runs
        sim_rows = ex.map(
            execute,
            unique,
            on_done=on_done,
            cost=lambda s: s.b * (s.input_len + s.output_len + 1),
        )
    finally:
        if owned:
            ex.close()
    metrics = dict(zip(unique, sim_rows, strict=True))
    results = pd.DataFrame([_row(r, metrics[r.sim]) for r in runs])
    csp: pd.DataFrame | None = None
    csp_note = ""
    if "csp" in plan.analyses and plan.csp_solver:
        fn, csp_note = (csp_sweep, "") if csp_sweep is not None else load_csp_sweep()
        solve_inputs = list(plan.csp_solver_inputs or plan.csp_inputs)
        if fn is not None:
            if progress:
                progress("solving the CSP", 0, len(solve_inputs))
            extra = _csp_extras(fn, n_workers, plan.csp_time_limit_s)
            csp = fn(
                solve_inputs,
                output=plan.csp_o,
                num_requests=plan.csp_b,
                profile=plan.profile,
                time_limit_s=plan.csp_time_limit_s,
                seed=plan.seed,
                workers=n_workers,
                **extra,
            )
            if progress:
                progress("solving the CSP", len(solve_inputs), len(solve_inputs))
    if len(results):
        results.to_parquet(out_dir / "results.parquet", index=False)
    if csp is not None:
        csp.to_parquet(out_dir / "csp.parquet", index=False)
    head = headline(results, csp, plan)
    if csp_note:
        head["csp_note"] = csp_note
    head["plan"] = asdict(plan)
    findings = findings_table(head)
    (out_dir / "headline.json").write_text(json.dumps(jsonable(head), indent=2) + "\n")
    (out_dir / "findings.md").write_text(findings_markdown(findings, head))
    plot(results, csp, out_dir)
    return Reproduction(results, csp, head, findings)
