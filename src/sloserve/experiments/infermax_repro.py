"""``sloserve reproduce infermax``: InferMax §4 and appendix A.3 in simulation.

Analyses (each a grid of runs of one unified-scheduler preset on one replica):

* ``contention`` (§4.2, Figures 5 and 6): B = 1024 requests of fixed input I and output O
  over an I × O grid; latency, TPS, TTFT, TPOT, evictions, running size per preset.
* ``eviction`` (§4.3, Figure 8): O = B = 1024, each preset against its eviction-free
  (``-ef``) variant, and the running size of the eviction-free ones against M/(I+O).
* ``memory`` (§4.4, Figure 9): O = 32, B = 1024, M from 100 to 1M tokens, evicting against
  eviction-free presets; only the (I, M) points where a request can be served at all
  (I + O − 1 ≤ M) are run, which is what the paper's cropped x-axes show.
* ``csp`` (§4.5): O = B = 4, I from 1 to 1024, M = max(2I, I+O−1). Every preset and its
  eviction-free variant is simulated here; the optimum comes from the CSP engineer's
  ``sloserve.experiments.infermax_csp.csp_eviction_sweep`` when that module exists (its
  status and gap are kept in ``csp.parquet``; when it is missing the headline says so and
  the preset half of the analysis still runs).
* ``rmax`` (§4.6, Figure 11): R_max from 32 to 512 for O = 32 and O = 1024.
* ``ranking`` (appendix A.3, Figures 15–17): Rank_org / Rank_I / Rank_O on the six pairwise
  mixes of SISO, SILO, LISO, LILO, B from 16 to 1024.

InferMax's setting (§4.1): Llama-2-7B on an A100 (profile ``llama-2-7b-a100``), C = 4096,
M = 100K tokens, block size 1 (token-exact M), all requests present at t = 0 (offline), the
``oracle`` output-length predictor (eviction-free reservations and the ranking by O).

Choices where the paper is vague (all fields of :class:`Plan`):

* **Latency** is the total latency (makespan: the last request's finish, all arriving at 0)
  and TPS = generated tokens / latency, as §4.1 defines them; TTFT and TPOT are means over
  requests (TPOT is undefined for O = 1 and left empty).
* **R_max** is unlimited (= B) outside §4.6: §4.1 says it was raised "from 128 to
  unlimited" to expose the schedulers' own features.
* **No watermark** (``watermark = 0``): Algorithm 1's CanAllocate has none; vLLM's 1% would
  take 1,000 tokens off M = 100K and all of M = 100.
* **Running size** is the mean number of running requests per batch (weighted by
  iterations); the *steady* running size averages only the batches during which requests
  were still waiting, so that the ramp-down of the last wave does not dilute it. It is
  compared with ``min(B, R_max, M/(I+O))`` (the paper's effective running size).
* **Rank_org** is the ranking preset's configuration (one group, Sarathi batching,
  preemptive) with FCFS order: "no prioritization by I or O". The mixes' requests are in
  the shuffled order the mix draws them (seeded).
* **Eviction effect** (the headline's 35% / 27% figures): for each I, the gain of evicting
  is ``1 − L_evicting / L_eviction-free`` — positive where evicting helps (small I), its
  negative is the cost ``1 − L_ef / L_evicting`` where eviction-free wins (large I).

``Plan.quick()`` finishes in under 2 minutes on two shared cores; ``Plan.full()`` is the
paper's grids (10–20 minutes on two cores).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.core.request import Request
from sloserve.costmodel.profile import load_profile
from sloserve.experiments.report import jsonable
from sloserve.experiments.runner import InstanceConfig, SimConfig, simulate
from sloserve.policies.registry import make_policy
from sloserve.workloads import ConstantArrivals, WorkloadSpec, build_requests
from sloserve.workloads.mixes import get_mix

CSP_METRIC = "latency_sum_s"
"""§4.5 compares Σ request latencies, the CSP sweep's objective (its ``optimal_latency``)."""
ANALYSES = ("contention", "eviction", "memory", "csp", "rmax", "ranking")
PRESETS = ("vllm", "sarathi", "sarathi-p=c", "sarathi-nocp", "vllm-hy", "sarathi-nohy")
RANKERS: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    "rank-org": ("rank-input", (("order", "fcfs"),)),
    "rank-input": ("rank-input", ()),
    "rank-output": ("rank-output", ()),
}
PAIR_MIXES = tuple(
    f"infermax-{a}+{b}"
    for i, a in enumerate(("siso", "silo", "liso", "lilo"))
    for b in ("siso", "silo", "liso", "lilo")[i + 1 :]
)
POW2 = tuple(2**k for k in range(11))  # 1 … 1024

# The paper's numbers each headline finding is set beside (InferMax §4, A.3).
PAPER: dict[str, Any] = {
    "sarathi_tps_below_vllm_max": 0.409,
    "sarathi_tpot_below_vllm_max_x": 5.0,
    "ef_tps_gain_max": {"vllm": 0.069, "sarathi": 0.017, "sarathi-p=c": 0.031},
    "ef_ttft_increase_max_x": {"vllm": 1800.0, "sarathi": 1.917},
    "ef_tpot_reduction_max_x": {"vllm": 13.0, "sarathi": 6.5},
    "ef_running_size": {"I=1": 98.0, "I=1024": 49.0},
    "evict_tps_gain_x": {
        "M=100": {"vllm": 2.2, "sarathi": 2.3},
        "M=1000": {"vllm": 1.2, "sarathi": 1.3},
    },
    "evict_tps_loss_x_at_M=10000": {"vllm": 1.5, "sarathi": 1.3},
    "kv_usage_at_M=1e6_below": 0.2,
    "csp_evict_latency_cut_max": 0.352,
    "csp_ef_latency_cut_max": 0.275,
    "csp_evicts_below_I": 128,
    "rmax_best_O=1024": 128,
    "rmax_O=32": "TPS keeps increasing with R_max",
    "rank_input_latency_x": {"rank-output": 1.3, "rank-org": 1.4},
    "rank_input_ttft_x": {"rank-output": 3.0, "rank-org": 2.0},
}


@dataclass(frozen=True)
class Plan:
    """The grids of one reproduction; every knob the paper leaves open is a field."""

    analyses: tuple[str, ...] = ANALYSES
    profile: str = "llama-2-7b-a100"
    max_batch_tokens: int = 4096
    """C."""
    kv_tokens: int = 100_000
    """M outside the memory sweep."""
    watermark: float = 0.0
    seed: int = 0
    # §4.2
    contention_b: int = 1024
    contention_inputs: tuple[int, ...] = POW2
    contention_outputs: tuple[int, ...] = (1, 4, 16, 32, 64, 256, 1024)
    contention_policies: tuple[str, ...] = PRESETS
    # §4.3
    eviction_o: int = 1024
    eviction_b: int = 1024
    eviction_inputs: tuple[int, ...] = POW2
    eviction_policies: tuple[str, ...] = PRESETS
    # §4.4
    memory_values: tuple[int, ...] = (100, 1_000, 10_000, 100_000, 1_000_000)
    memory_o: int = 32
    memory_b: int = 1024
    memory_inputs: tuple[int, ...] = POW2
    memory_policies: tuple[str, ...] = ("vllm", "sarathi", "sarathi-p=c")
    # §4.5
    csp_o: int = 4
    csp_b: int = 4
    csp_inputs: tuple[int, ...] = POW2
    csp_policies: tuple[str, ...] = PRESETS
    csp_solver: bool = True
    """Call the CSP sweep (needs ``sloserve.experiments.infermax_csp``)."""
    csp_time_limit_s: float = 10.0
    csp_solver_inputs: tuple[int, ...] | None = None
    """The I values the CSP solves (None: ``csp_inputs``); two solves per I."""
    # §4.6
    rmax_values: tuple[int, ...] = (32, 64, 128, 256, 512)
    rmax_outputs: tuple[int, ...] = (32, 1024)
    rmax_b: int = 1024
    rmax_inputs: tuple[int, ...] = (1, 4, 16, 64, 256, 1024)
    rmax_policies: tuple[str, ...] = ("vllm", "sarathi", "sarathi-p=c")
    # A.3
    ranking_mixes: tuple[str, ...] = PAIR_MIXES
    ranking_bs: tuple[int, ...] = (16, 64, 256, 1024)
    ranking_policies: tuple[str, ...] = tuple(RANKERS)

    def __post_init__(self) -> None:
        bad = sorted(set(self.analyses) - set(ANALYSES))
        if bad or not self.analyses:
            raise ConfigError(
                f"unknown analysis {', '.join(bad) or '(none given)'}; valid: {', '.join(ANALYSES)}"
            )
        ints = {
            "contention_inputs": self.contention_inputs,
            "contention_outputs": self.contention_outputs,
            "eviction_inputs": self.eviction_inputs,
            "memory_values": self.memory_values,
            "memory_inputs": self.memory_inputs,
            "csp_inputs": self.csp_inputs,
            "csp_solver_inputs": self.csp_solver_inputs or (),
            "rmax_values": self.rmax_values,
            "rmax_outputs": self.rmax_outputs,
            "rmax_inputs": self.rmax_inputs,
            "ranking_bs": self.ranking_bs,
        }
        for name, vals in ints.items():
            if any(int(v) < 1 for v in vals):
                raise ConfigError(f"{name}: every value must be >= 1, got {list(vals)}")
        for name in (
            "contention_b",
            "eviction_b",
            "eviction_o",
            "memory_b",
            "memory_o",
            "csp_b",
            "csp_o",
            "rmax_b",
            "kv_tokens",
            "max_batch_tokens",
        ):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.watermark < 1:
            raise ConfigError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.csp_time_limit_s <= 0:
            raise ConfigError(f"csp_time_limit_s must be > 0, got {self.csp_time_limit_s}")
        for pols in (
            self.contention_policies,
            self.eviction_policies,
            self.memory_policies,
            self.csp_policies,
            self.rmax_policies,
        ):
            for p in pols:
                make_policy(p)  # unknown names fail here, listing the valid ones
                if p.endswith("-ef"):
                    raise ConfigError(f"{p}: list base presets; -ef variants are added")
        for r in self.ranking_policies:
            if r not in RANKERS:
                raise ConfigError(f"unknown ranker {r!r}; valid: {', '.join(RANKERS)}")
        for m in self.ranking_mixes:
            get_mix(m)
        load_profile(self.profile)

    @staticmethod
    def quick(seed: int = 0, analyses: Sequence[str] = ANALYSES) -> Plan:
        """A reduced grid: under 2 minutes on two shared cores."""
        return Plan(
            analyses=tuple(analyses),
            seed=seed,
            contention_inputs=(1, 128, 1024),
            contention_outputs=(1, 32, 256),
            contention_policies=("vllm", "sarathi", "sarathi-p=c"),
            eviction_inputs=(1, 1024),
            eviction_policies=("vllm", "sarathi"),
            memory_inputs=(1, 64, 512),
            memory_policies=("vllm", "sarathi"),
            csp_inputs=(1, 4, 16, 64, 128, 256, 1024),
            csp_policies=("vllm", "sarathi", "sarathi-p=c"),
            csp_solver_inputs=(1, 16, 256),
            csp_time_limit_s=2.0,
            rmax_values=(32, 128, 512),
            rmax_inputs=(128,),
            rmax_policies=("vllm",),
            ranking_mixes=("infermax-siso+lilo", "infermax-liso+lilo"),
            ranking_bs=(256,),
        )

    @staticmethod
    def full(seed: int = 0, analyses: Sequence[str] = ANALYSES) -> Plan:
        """The paper's grids."""
        return Plan(analyses=tuple(analyses), seed=seed)


@dataclass(frozen=True)
class Sim:
    """One simulation: the same Sim in two analyses runs once."""

    policy: str
    params: tuple[tuple[str, Any], ...]
    input_len: int
    """I (0 for a mix)."""
    output_len: int
    """O (0 for a mix)."""
    mix: str
    b: int
    m: int
    rmax: int
    c: int
    profile: str
    seed: int

    def config(self) -> SimConfig:
        return SimConfig(
            instance=InstanceConfig(
                profile=self.profile,
                max_running=self.rmax,
                max_batch_tokens=self.c,
                block_size=1,
                kv_capacity_tokens=self.m,
                cpu_swap_gib=0.0,
                predictor="oracle",
            ),
            policy=self.policy,
            policy_params=dict(self.params),
        )

    def requests(self) -> list[Request]:
        """B requests, all present at t = 0 (InferMax's offline setting)."""
        if not self.mix:
            return [Request(i, 0.0, self.input_len, self.output_len) for i in range(self.b)]
        spec = WorkloadSpec(
            mix=self.mix,
            arrival=ConstantArrivals(rate=1.0),
            num_requests=self.b,
            duration_s=None,
            slo="none",
            seed=self.seed,
        )
        return [
            Request(r.req_id, 0.0, r.num_prompt_tokens, r.true_output_len)
            for r in build_requests(spec)
        ]


@dataclass(frozen=True)
class Run:
    """One row of the results: an analysis' name for a :class:`Sim` and its knob."""

    analysis: str
    label: str
    sim: Sim
    evicting: bool


def plan_runs(plan: Plan) -> list[Run]:
    """Every run of the plan's analyses, in a fixed order."""
    runs: list[Run] = []

    def sim(
        policy: str,
        i: int,
        o: int,
        b: int,
        m: int,
        rmax: int | None = None,
        params: tuple[tuple[str, Any], ...] = (),
        mix: str = "",
    ) -> Sim:
        p = tuple(sorted({**dict(params), "watermark": plan.watermark}.items()))
        return Sim(
            policy, p, i, o, mix, b, m, rmax or b, plan.max_batch_tokens, plan.profile, plan.seed
        )

    def with_ef(analysis: str, policies: Sequence[str], i: int, o: int, b: int, m: int) -> None:
        for p in policies:
            for name in (p, f"{p}-ef"):
                runs.append(Run(analysis, name, sim(name, i, o, b, m), not name.endswith("-ef")))

    a = plan.analyses
    if "contention" in a:
        for o in plan.contention_outputs:
            for i in plan.contention_inputs:
                for p in plan.contention_policies:
                    runs.append(
                        Run("contention", p, sim(p, i, o, plan.contention_b, plan.kv_tokens), True)
                    )
    if "eviction" in a:
        for i in plan.eviction_inputs:
            with_ef(
                "eviction",
                plan.eviction_policies,
                i,
                plan.eviction_o,
                plan.eviction_b,
                plan.kv_tokens,
            )
    if "memory" in a:
        for m in plan.memory_values:
            for i in plan.memory_inputs:
                if i + plan.memory_o - 1 <= m:  # else no request can ever finish
                    with_ef("memory", plan.memory_policies, i, plan.memory_o, plan.memory_b, m)
    if "csp" in a:
        for i in plan.csp_inputs:
            m = max(2 * i, i + plan.csp_o - 1)
            with_ef("csp", plan.csp_policies, i, plan.csp_o, plan.csp_b, m)
    if "rmax" in a:
        for o in plan.rmax_outputs:
            for r in plan.rmax_values:
                for i in plan.rmax_inputs:
                    for p in plan.rmax_policies:
                        s = sim(p, i, o, plan.rmax_b, plan.kv_tokens, rmax=r)
                        runs.append(Run("rmax", p, s, True))
    if "ranking" in a:
        for mix in plan.ranking_mixes:
            for b in plan.ranking_bs:
                for label in plan.ranking_policies:
                    pol, params = RANKERS[label]
                    s = sim(pol, 0, 0, b, plan.kv_tokens, params=params, mix=mix)
                    runs.append(Run("ranking", label, s, True))
    return runs


def _int(x: Any) -> int:
    """``int`` of a pandas label or scalar (typed loosely by pandas-stubs)."""
    return int(x)


def _any(x: Any) -> Any:
    return x


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
        mod = importlib.import_module("sloserve.experiments.infermax_csp")
    except ImportError as e:
        return None, f"CSP sweep unavailable: {e}"
    fn = getattr(mod, "csp_eviction_sweep", None)
    if not callable(fn):
        return None, "CSP sweep unavailable: infermax_csp has no csp_eviction_sweep"
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


def _map(
    fn: Callable[[Sim], dict[str, Any]],
    items: list[Sim],
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if workers == 1 or len(items) <= 1:
        for k, s in enumerate(items):
            out.append(fn(s))
            if progress:
                progress(k + 1, len(items))
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        # the longest (largest B·(I+O)) first, so no worker is left with a tail of big runs
        order = sorted(
            range(len(items)),
            key=lambda k: -items[k].b * (items[k].input_len + items[k].output_len + 1),
        )
        futures = {k: pool.submit(fn, items[k]) for k in order}
        res: dict[int, dict[str, Any]] = {}
        for n, k in enumerate(order):
            res[k] = futures[k].result()
            if progress:
                progress(n + 1, len(items))
        out = [res[k] for k in range(len(items))]
    return out


def reproduce(
    plan: Plan,
    out: str | Path,
    *,
    workers: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    csp_sweep: CspSweep | None = None,
) -> Reproduction:
    """Run the plan (simulations in parallel processes), then the CSP sweep, and write
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
    metrics = dict(zip(unique, _map(execute, unique, n_workers, cb), strict=True))
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


# ----------------------------------------------------------------------------- headline
def _pivot(df: pd.DataFrame, index: list[str], value: str) -> pd.DataFrame:
    return df.pivot_table(index=index, columns="label", values=value, aggfunc="first")


def _max(s: pd.Series) -> float | None:
    v = s.replace([np.inf, -np.inf], np.nan).dropna()
    return float(v.max()) if len(v) else None


def _argmax(s: pd.Series) -> Any:
    v = s.replace([np.inf, -np.inf], np.nan).dropna()
    return v.idxmax() if len(v) else None


def headline(results: pd.DataFrame, csp: pd.DataFrame | None, plan: Plan) -> dict[str, Any]:
    """Our numbers for each of the paper's findings (``PAPER``), per analysis."""
    out: dict[str, Any] = {"paper": PAPER}
    by = {a: g for a, g in results.groupby("analysis")} if len(results) else {}
    if "contention" in by:
        out["contention"] = _contention(by["contention"])
    if "eviction" in by:
        out["eviction"] = _eviction(by["eviction"])
    if "memory" in by:
        out["memory"] = _memory(by["memory"])
    if "csp" in by or csp is not None:
        out["csp"] = _csp(by.get("csp"), csp)
    if "rmax" in by:
        out["rmax"] = _rmax(by["rmax"])
    if "ranking" in by:
        out["ranking"] = _ranking(by["ranking"])
    return out


def _contention(g: pd.DataFrame) -> dict[str, Any]:
    h: dict[str, Any] = {}
    lat = _pivot(g, ["I", "O"], "latency_s")
    # "lowest" within 0.5% of the best: presets often tie (e.g. all equal at O = 1)
    best = lat.min(axis=1)
    h["lowest_latency_share"] = {
        str(c): float((lat[c] <= 1.005 * best).mean()) for c in lat.columns
    }
    if {"vllm", "sarathi"} <= set(lat.columns):
        tps = _pivot(g, ["I", "O"], "tps")
        tpot = _pivot(g, ["I", "O"], "tpot_mean_s")
        ttft = _pivot(g, ["I", "O"], "ttft_mean_s")
        h["sarathi_tps_below_vllm_max"] = _max(1 - tps["sarathi"] / tps["vllm"])
        ratio = tpot["vllm"] / tpot["sarathi"]
        h["sarathi_tpot_below_vllm_max_x"] = _max(ratio)
        h["sarathi_tpot_below_vllm_max_x_by_O"] = {
            str(_int(o)): _max(v) for o, v in ratio.groupby(level="O")
        }
        h["vllm_ttft_below_sarathi_share"] = float((ttft["vllm"] < ttft["sarathi"]).mean())
        h["vllm_tps_above_sarathi_share"] = float((tps["vllm"] >= tps["sarathi"]).mean())
    ev = g.groupby("O")["evictions"].mean()
    h["mean_evictions_by_O"] = {_int(k): float(v) for k, v in ev.items()}
    return h


def _ratio_max(piv: pd.DataFrame, num: str, den: str) -> float | None:
    if num in piv.columns and den in piv.columns:
        return _max(piv[num] / piv[den])
    return None


def _eviction(g: pd.DataFrame) -> dict[str, Any]:
    h: dict[str, Any] = {
        "ef_tps_gain_max": {},
        "ef_ttft_increase_max_x": {},
        "ef_tpot_reduction_max_x": {},
        "ef_running_size": {},
    }
    tps, ttft, tpot = (_pivot(g, ["I"], v) for v in ("tps", "ttft_mean_s", "tpot_mean_s"))
    for base in sorted(set(g["base"])):
        ef = f"{base}-ef"
        r = _ratio_max(tps, ef, base)
        h["ef_tps_gain_max"][base] = r - 1 if r is not None else None
        h["ef_ttft_increase_max_x"][base] = _ratio_max(ttft, ef, base)
        h["ef_tpot_reduction_max_x"][base] = _ratio_max(tpot, base, ef)
    efr = g[~g["evicting"]]
    for i, gi in efr.groupby("I"):
        # the median over presets: sarathi-nohy-ef, which admits prompts only when no
        # decode runs, keeps far fewer requests running and would drag a mean down
        h["ef_running_size"][f"I={_int(i)}"] = {
            "measured_steady": float(gi["running_steady"].median()),
            "measured_mean": float(gi["running_mean"].median()),
            "M/(I+O)": float(gi["effective_running"].iloc[0]),
            "per_preset": {
                str(k): float(v) for k, v in zip(gi["label"], gi["running_steady"], strict=True)
            },
        }
    h["evictions_by_label"] = g.groupby("label")["evictions"].sum().astype(int).to_dict()
    return h


def _memory(g: pd.DataFrame) -> dict[str, Any]:
    h: dict[str, Any] = {"evict_tps_gain_max_x": {}, "evict_tps_loss_max_x": {}}
    for m, gm in g.groupby("M"):
        tps = _pivot(gm, ["I"], "tps")
        gain, loss = {}, {}
        for base in sorted(set(gm["base"])):
            gain[base] = _ratio_max(tps, base, f"{base}-ef")
            loss[base] = _ratio_max(tps, f"{base}-ef", base)
        h["evict_tps_gain_max_x"][f"M={_int(m)}"] = gain
        h["evict_tps_loss_max_x"][f"M={_int(m)}"] = loss
    top = g[g["M"] == g["M"].max()]
    h["kv_usage_at_max_M"] = {
        "M": int(g["M"].max()),
        **{str(k): float(v) for k, v in top.groupby("label")["kv_usage_mean"].mean().items()},
    }
    # The effective running size M/(I+O), checked where memory is what binds: below B and
    # R_max, and below the prefill-rate bound O·P/I (at most P/I new requests per batch,
    # each running about O batches), and at least 2 (else integer rounding dominates).
    rate_bound = g["O"] * g["P"] / g["I"]
    ef = g[
        (~g["evicting"])
        & (g["effective_running"] < g[["B", "R_max"]].min(axis=1))
        & (g["effective_running"] <= rate_bound)
        & (g["effective_running"] >= 2)
        & g["running_steady"].notna()
    ]
    if len(ef):
        rel = (ef["running_steady"] / ef["effective_running"] - 1).abs()
        h["running_vs_M_over_IO"] = {
            "points": len(ef),
            "median_rel_error": float(rel.median()),
            "max_rel_error": float(rel.max()),
            "worst": ef.loc[
                _any(rel.idxmax()), ["label", "I", "M", "running_steady", "effective_running"]
            ].to_dict(),
        }
    return h


def _csp(g: pd.DataFrame | None, csp: pd.DataFrame | None) -> dict[str, Any]:
    h: dict[str, Any] = {"metric": CSP_METRIC}
    lat = pd.DataFrame()
    if g is not None and len(g):
        lat = _pivot(g, ["I"], CSP_METRIC)
        evl = [c for c in lat.columns if not str(c).endswith("-ef")]
        efl = [c for c in lat.columns if str(c).endswith("-ef")]
        best_ev, best_ef = lat[evl].min(axis=1), lat[efl].min(axis=1)
        gain = 1 - best_ev / best_ef  # > 0: the best evicting preset beats every ef one
        per_i: dict[str, Any] = {}
        for i in lat.index:
            row: dict[str, Any] = {
                "best_evicting": str(lat.loc[i, evl].idxmin()),
                "best_evicting_latency_s": float(best_ev[i]),
                "best_ef": str(lat.loc[i, efl].idxmin()),
                "best_ef_latency_s": float(best_ef[i]),
                "evict_gain": float(gain[i]),
            }
            if "vllm" in lat.columns and "vllm-ef" in lat.columns:
                row["vllm_evict_gain"] = float(1 - lat.loc[i, "vllm"] / lat.loc[i, "vllm-ef"])
            per_i[str(int(i))] = row
        h["presets"] = per_i
        small, large = gain[gain.index < 128], gain[gain.index >= 128]
        h["presets_evict_cut_max_small_I"] = _max(small) if len(small) else None
        cost = 1 - best_ef / best_ev
        h["presets_ef_cut_max_large_I"] = _max(cost[cost.index >= 128]) if len(large) else None
        if "vllm" in lat.columns and "vllm-ef" in lat.columns:
            vg = 1 - lat["vllm"] / lat["vllm-ef"]
            vc = 1 - lat["vllm-ef"] / lat["vllm"]
            h["vllm_evict_cut_max_small_I"] = _max(vg[vg.index < 128])
            h["vllm_ef_cut_max_large_I"] = _max(vc[vc.index >= 128])
            helps = [int(i) for i in vg.index if vg[i] > 0]
            h["vllm_evicting_wins_at_I"] = helps
    if csp is not None and len(csp):
        c = csp.copy()
        c["best_latency"] = c["optimal_latency"]
        c["evicts"] = c["optimal_evictions"].fillna(0) > 0
        if "best_evicting_latency" in c:
            # the forced-eviction solve can find a better schedule than the main solve
            # when both stop at the time limit: the best known schedule then evicts
            better = c["best_evicting_latency"] < c["optimal_latency"] * (1 - 1e-6)
            c.loc[better, "best_latency"] = c.loc[better, "best_evicting_latency"]
            c["evicts"] = c["evicts"] | better
        # (best eviction-free − best known) / best eviction-free, as the sweep's own gap
        c["opt_vs_best_ef"] = 1 - c["best_latency"] / c["best_ef_latency"]
        h["solver"] = {
            "statuses": {str(k): int(v) for k, v in c["status"].value_counts().items()},
            "optimum_evicts_at_I": [int(i) for i in c.loc[c["evicts"], "I"]],
            "optimum_no_evict_at_I": [int(i) for i in c.loc[~c["evicts"], "I"]],
            "evict_cut_max": _max(c.loc[c["evicts"], "opt_vs_best_ef"]),
            "max_gap": _max(c["gap"]) if "gap" in c else None,
            "not_optimal_at_I": [int(i) for i in c.loc[c["status"] != "optimal", "I"]],
        }
        if "eviction_cost_pct" in c:
            # §4.5's 27.5%: the best evicting schedule against the eviction-free optimum
            long_ = c[(c["I"] >= 128) & ~c["evicts"]]
            h["solver"]["eviction_cost_max_large_I"] = (
                _max(long_["eviction_cost_pct"] / 100) if len(long_) else None
            )
        if len(lat):
            # a preset simulated here that beats the solver's answer: that answer is not
            # optimal (time limit), whatever the sweep's hint was
            best = lat.min(axis=1).reindex(c["I"].to_numpy()).to_numpy()
            worse = best < c["best_latency"].to_numpy() * (1 - 1e-6)
            h["solver"]["preset_beats_solver_at_I"] = [
                int(i) for i, w in zip(c["I"], worse, strict=True) if w
            ]
        if "vllm" in lat.columns:
            # §4.5's 27.5%: for long inputs the (non-evicting) optimum against evicting vLLM
            v = lat["vllm"].reindex(c["I"].to_numpy())
            cut = 1 - c["best_latency"].to_numpy() / v.to_numpy()
            big = c["I"].to_numpy() >= 128
            h["solver"]["optimum_vs_vllm_cut_max_large_I"] = (
                float(np.nanmax(cut[big])) if big.any() and np.isfinite(cut[big]).any() else None
            )
        non = c.loc[~c["evicts"], "I"]
        ev = c.loc[c["evicts"], "I"]
        h["solver"]["crossover_I"] = (
            int(non[non > ev.max()].min()) if len(ev) and (non > ev.max()).any() else None
        )
    return h


def _rmax(g: pd.DataFrame) -> dict[str, Any]:
    h: dict[str, Any] = {}
    for (o, label), go in g.groupby(["O", "label"]):
        tps = go.groupby("R_max")["tps"].mean()
        per_i = {}
        for i, gi in go.groupby("I"):
            t = gi.set_index("R_max")["tps"]
            per_i[str(_int(i))] = {
                "best_R_max": int(_argmax(t)),
                "M/(I+O)": float(gi["M"].iloc[0] / (_int(i) + _int(o))),
            }
        h[f"O={_int(o)}/{label}"] = {
            "best_R_max_mean_tps": int(_argmax(tps)),
            # non-decreasing within 1%: a plateau once R_max no longer binds counts
            "tps_increasing": bool(np.all(np.diff(tps.to_numpy()) >= -0.01 * tps.max())),
            "per_I": per_i,
        }
    return h


def _ranking(g: pd.DataFrame) -> dict[str, Any]:
    h: dict[str, Any] = {"latency_x": {}, "ttft_x": {}, "tpot_x": {}}
    for key, col in (
        ("latency_x", "latency_s"),
        ("ttft_x", "ttft_mean_s"),
        ("tpot_x", "tpot_mean_s"),
    ):
        piv = _pivot(g, ["mix", "B"], col)
        if "rank-input" not in piv.columns:
            continue
        for other in ("rank-output", "rank-org"):
            if other in piv.columns:
                r = piv[other] / piv["rank-input"]
                h[key][other] = {
                    "max": _max(r),
                    "where": "/".join(str(x) for x in _argmax(r)) if _max(r) is not None else None,
                    "per_mix": {m: float(v) for m, v in r.groupby(level=0).max().items()},
                }
    return h


def _fmt(v: Any, pct: bool = False, x: bool = False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if pct:
            return f"{100 * v:.1f}%"
        if x:
            return f"{v:.2f}x"
        return f"{v:.3g}"
    return str(v)


def findings_table(head: dict[str, Any]) -> pd.DataFrame:
    """The paper's findings beside ours, one row per number (``–``: not in this run)."""
    P = PAPER
    rows: list[tuple[str, str, str, str]] = []

    def add(sec: str, what: str, paper: str, ours: str) -> None:
        rows.append((sec, what, paper, ours))

    c = head.get("contention")
    if c:
        add(
            "4.2",
            "Sarathi TPS below vLLM, up to",
            _fmt(P["sarathi_tps_below_vllm_max"], True),
            _fmt(c.get("sarathi_tps_below_vllm_max"), True),
        )
        by_o = c.get("sarathi_tpot_below_vllm_max_x_by_O") or {}
        fig5 = [v for o, v in by_o.items() if o in ("32", "1024") and v is not None]
        add(
            "4.2",
            "Sarathi TPOT below vLLM, up to",
            _fmt(P["sarathi_tpot_below_vllm_max_x"], x=True),
            _fmt(c.get("sarathi_tpot_below_vllm_max_x"), x=True)
            + (f" ({_fmt(max(fig5), x=True)} at O = 32, 1024)" if fig5 else ""),
        )
        add(
            "4.2",
            "vLLM TTFT below Sarathi (share of I×O points)",
            "lower TTFT",
            _fmt(c.get("vllm_ttft_below_sarathi_share"), True),
        )
        add(
            "4.2",
            "vLLM lowest latency, within 0.5% (share of I×O points)",
            "lowest but at high O",
            _fmt(c.get("lowest_latency_share", {}).get("vllm"), True),
        )
    e = head.get("eviction")
    if e:
        for base, pv in P["ef_tps_gain_max"].items():
            add(
                "4.3",
                f"eviction-free TPS gain over {base}, up to",
                _fmt(pv, True),
                _fmt(e["ef_tps_gain_max"].get(base), True),
            )
        for base, pv in P["ef_ttft_increase_max_x"].items():
            add(
                "4.3",
                f"eviction-free TTFT increase, {base}, up to",
                _fmt(pv, x=True),
                _fmt(e["ef_ttft_increase_max_x"].get(base), x=True),
            )
        for base, pv in P["ef_tpot_reduction_max_x"].items():
            add(
                "4.3",
                f"eviction-free TPOT reduction, {base}, up to",
                _fmt(pv, x=True),
                _fmt(e["ef_tpot_reduction_max_x"].get(base), x=True),
            )
        for key, pv in P["ef_running_size"].items():
            got = e["ef_running_size"].get(key)
            add(
                "4.3",
                f"eviction-free running size at {key}, median preset (≈ M/(I+O))",
                _fmt(pv),
                _fmt(got["measured_steady"]) + f" (M/(I+O) = {got['M/(I+O)']:.1f})" if got else "–",
            )
    m = head.get("memory")
    if m:
        for mk, per in P["evict_tps_gain_x"].items():
            for base, pv in per.items():
                add(
                    "4.4",
                    f"evicting TPS over eviction-free, {base}, {mk}, up to",
                    _fmt(pv, x=True),
                    _fmt(m["evict_tps_gain_max_x"].get(mk, {}).get(base), x=True),
                )
        for base, pv in P["evict_tps_loss_x_at_M=10000"].items():
            add(
                "4.4",
                f"eviction-free TPS over evicting, {base}, M=10000, up to",
                _fmt(pv, x=True),
                _fmt(m["evict_tps_loss_max_x"].get("M=10000", {}).get(base), x=True),
            )
        k = m.get("kv_usage_at_max_M", {})
        sar = [v for lab, v in k.items() if lab.startswith("sarathi") and isinstance(v, float)]
        add(
            "4.4",
            f"Sarathi KV usage at M={k.get('M')}",
            "< 20%",
            _fmt(max(sar), True) if sar else "–",
        )
        r = m.get("running_vs_M_over_IO")
        add(
            "4.3/4.4",
            "eviction-free running size vs M/(I+O), median (max) error",
            "≈",
            f"{_fmt(r['median_rel_error'], True)} ({_fmt(r['max_rel_error'], True)}), "
            f"{r['points']} points"
            if r
            else "–",
        )
    s = head.get("csp")
    if s:
        sol = s.get("solver") or {}
        note = head.get("csp_note", "–")
        evicts = sol.get("optimum_evicts_at_I") or []
        add(
            "4.5",
            "optimum evicts at I (solved)",
            "I < 128",
            ", ".join(map(str, evicts)) or "none" if sol else note,
        )
        add(
            "4.5",
            "optimum does not evict from I",
            "128",
            _fmt(sol.get("crossover_I")) if sol else note,
        )
        add(
            "4.5",
            "optimum vs best eviction-free schedule, cut up to",
            _fmt(P["csp_evict_latency_cut_max"], True),
            _fmt(sol.get("evict_cut_max"), True),
        )
        add(
            "4.5",
            "optimum (no evictions) vs vLLM (evicting), I ≥ 128, cut up to",
            _fmt(P["csp_ef_latency_cut_max"], True),
            _fmt(sol.get("optimum_vs_vllm_cut_max_large_I"), True),
        )
        if "eviction_cost_max_large_I" in sol:
            add(
                "4.5",
                "best evicting schedule vs eviction-free optimum, I ≥ 128, cost up to",
                _fmt(P["csp_ef_latency_cut_max"], True),
                _fmt(sol["eviction_cost_max_large_I"], True),
            )
        if sol.get("preset_beats_solver_at_I"):
            add(
                "4.5",
                "a preset beats the solver's schedule at I (not optimal)",
                "–",
                ", ".join(map(str, sol["preset_beats_solver_at_I"])),
            )
        if sol.get("not_optimal_at_I"):
            add(
                "4.5",
                "CSP not proven optimal at I (time limit)",
                "–",
                ", ".join(map(str, sol["not_optimal_at_I"])) + f" (max gap "
                f"{_fmt(sol.get('max_gap'), True)})",
            )
        add(
            "4.5",
            "vLLM (evicting) vs vLLM-ef, I < 128, cut up to",
            _fmt(P["csp_evict_latency_cut_max"], True) + " (CSP)",
            _fmt(s.get("vllm_evict_cut_max_small_I"), True),
        )
        add(
            "4.5",
            "vLLM-ef vs vLLM (evicting), I ≥ 128, cut up to",
            _fmt(P["csp_ef_latency_cut_max"], True),
            _fmt(s.get("vllm_ef_cut_max_large_I"), True),
        )
        wins = s.get("vllm_evicting_wins_at_I")
        add(
            "4.5",
            "vLLM (evicting) beats vLLM-ef at I",
            "I < 128",
            ", ".join(map(str, wins)) if wins is not None else "–",
        )
    rm = head.get("rmax")
    if rm:
        for key, v in rm.items():
            o = key.split("/")[0]
            paper = str(P["rmax_best_O=1024"]) if o == "O=1024" else "increasing"
            add(
                "4.6",
                f"best R_max (mean TPS), {key}",
                paper,
                f"{v['best_R_max_mean_tps']}" + (" (increasing)" if v["tps_increasing"] else ""),
            )
    rk = head.get("ranking")
    if rk:
        for key, pk, what in (
            ("latency_x", "rank_input_latency_x", "latency"),
            ("ttft_x", "rank_input_ttft_x", "TTFT"),
        ):
            for other, pv in P[pk].items():
                got = rk.get(key, {}).get(other)
                add(
                    "A.3",
                    f"Rank_I {what} below {other}, up to",
                    _fmt(pv, x=True),
                    (_fmt(got["max"], x=True) + f" ({got['where']})") if got else "–",
                )
    return pd.DataFrame(rows, columns=["section", "finding", "paper", "ours"])


def findings_markdown(findings: pd.DataFrame, head: dict[str, Any]) -> str:
    lines = ["| § | finding | paper | ours |", "|---|---|---|---|"]
    for r in findings.itertuples(index=False):
        lines.append(f"| {r.section} | {r.finding} | {r.paper} | {r.ours} |")
    if head.get("csp_note"):
        lines.append("")
        lines.append(f"Note: {head['csp_note']}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- plots
def plot(results: pd.DataFrame, csp: pd.DataFrame | None, out_dir: Path) -> list[Path]:
    """One figure per analysis present in ``results`` (and the CSP sweep); the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        p = out_dir / f"{name}.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)

    def lines(ax: Any, df: pd.DataFrame, x: str, y: str, logx: bool = True) -> None:
        for label, g in df.groupby("label", sort=True):
            g = g.sort_values(x)
            ax.plot(
                g[x],
                g[y],
                marker="o",
                ms=3,
                label=str(label),
                ls="--" if str(label).endswith("-ef") else "-",
            )
        if logx:
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)

    metrics = [
        ("latency_s", "latency (s)"),
        ("tps", "TPS"),
        ("ttft_mean_s", "TTFT (s)"),
        ("tpot_mean_s", "TPOT (s)"),
        ("evictions", "evictions"),
        ("running_mean", "running size"),
    ]
    by = {a: g for a, g in results.groupby("analysis")} if len(results) else {}
    if "contention" in by:
        g = by["contention"]
        outs = sorted(set(g["O"]))
        fig, axes = plt.subplots(
            len(metrics), len(outs), figsize=(3.2 * len(outs), 13), squeeze=False
        )
        for j, o in enumerate(outs):
            for k, (col, name) in enumerate(metrics):
                ax = axes[k][j]
                lines(ax, g[g["O"] == o], "I", col)
                ax.set_title(f"O={o}" if k == 0 else "", fontsize=9)
                ax.set_ylabel(name if j == 0 else "")
                ax.set_xlabel("I" if k == len(metrics) - 1 else "")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"§4.2 high contention (Fig. 5), B={int(g['B'].iloc[0])}", fontsize=10)
        save(fig, "contention")
        # Fig. 6: TPS over the I × O grid, one heat map per preset
        labs = sorted(set(g["label"]))
        fig, axes = plt.subplots(1, len(labs), figsize=(3.4 * len(labs), 3.2), squeeze=False)
        for ax, lab in zip(axes[0], labs, strict=True):
            piv = g[g["label"] == lab].pivot_table(index="O", columns="I", values="tps")
            im = ax.imshow(piv.to_numpy(), aspect="auto", origin="lower", cmap="viridis")
            ax.set_xticks(range(len(piv.columns)), [str(c) for c in piv.columns], fontsize=6)
            ax.set_yticks(range(len(piv.index)), [str(c) for c in piv.index], fontsize=6)
            ax.set_xlabel("I")
            ax.set_ylabel("O")
            ax.set_title(f"{lab}: TPS", fontsize=9)
            fig.colorbar(im, ax=ax)
        save(fig, "contention_tps")
    if "eviction" in by:
        g = by["eviction"]
        ms = metrics[1:]
        fig, axes = plt.subplots(1, len(ms), figsize=(3.3 * len(ms), 3.4), squeeze=False)
        for ax, (col, name) in zip(axes[0], ms, strict=True):
            lines(ax, g, "I", col)
            ax.set_ylabel(name)
            ax.set_xlabel("I")
            if col == "running_mean":
                e = g.drop_duplicates("I").sort_values("I")
                ax.plot(e["I"], e["effective_running"], color="k", ls=":", label="M/(I+O)")
        axes[0][-1].legend(fontsize=6)
        fig.suptitle("§4.3 eviction-free vs evicting (Fig. 8), O=B=1024", fontsize=10)
        save(fig, "eviction")
    if "memory" in by:
        g = by["memory"]
        mvals = sorted(set(g["M"]))
        ms = [
            ("tps", "TPS"),
            ("ttft_mean_s", "TTFT (s)"),
            ("tpot_mean_s", "TPOT (s)"),
            ("running_steady", "running size (steady)"),
            ("kv_usage_mean", "KV usage"),
        ]
        fig, axes = plt.subplots(len(ms), len(mvals), figsize=(3.0 * len(mvals), 11), squeeze=False)
        for j, m in enumerate(mvals):
            gm = g[g["M"] == m]
            for k, (col, name) in enumerate(ms):
                ax = axes[k][j]
                lines(ax, gm, "I", col)
                if col == "running_steady":
                    e = gm.drop_duplicates("I").sort_values("I")
                    ax.plot(e["I"], e["effective_running"], color="k", ls=":", label="M/(I+O)")
                ax.set_title(f"M={m:,}" if k == 0 else "", fontsize=9)
                ax.set_ylabel(name if j == 0 else "")
        axes[0][0].legend(fontsize=6)
        fig.suptitle("§4.4 M sweep (Fig. 9), O=32, B=1024", fontsize=10)
        save(fig, "memory")
    if "csp" in by or (csp is not None and len(csp)):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        if "csp" in by:
            g = by["csp"]
            lat = _pivot(g, ["I"], CSP_METRIC)
            evl = [c for c in lat.columns if not str(c).endswith("-ef")]
            efl = [c for c in lat.columns if str(c).endswith("-ef")]
            for col in ("vllm", "vllm-ef"):
                if col in lat.columns:
                    axes[0].plot(
                        lat.index,
                        lat[col],
                        marker="o",
                        ms=3,
                        label=col,
                        ls="--" if col.endswith("-ef") else "-",
                    )
            axes[0].plot(
                lat.index, lat[evl].min(axis=1), color="grey", lw=0.8, label="best evicting preset"
            )
            axes[0].plot(
                lat.index,
                lat[efl].min(axis=1),
                color="grey",
                lw=0.8,
                ls="--",
                label="best eviction-free preset",
            )
            gain = 100 * (1 - lat[evl].min(axis=1) / lat[efl].min(axis=1))
            axes[1].plot(gain.index, gain, marker="o", ms=3, label="best evicting preset")
        if csp is not None and len(csp):
            c = csp.sort_values("I")
            axes[0].plot(
                c["I"], c["optimal_latency"], color="k", marker="s", ms=4, label="CSP optimum"
            )
            gain = c["latency_gap_pct"]
            axes[1].plot(c["I"], gain, color="k", marker="s", ms=4, label="CSP optimum")
            ev = c["optimal_evictions"].fillna(0) > 0
            axes[1].scatter(
                c.loc[ev, "I"],
                gain[ev],
                s=60,
                facecolors="none",
                edgecolors="r",
                label="optimum evicts",
            )
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("I")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[0].set_yscale("log")
        axes[0].set_ylabel("Σ request latency (s)")
        axes[1].axhline(0, color="k", lw=0.6)
        axes[1].axvline(128, color="r", lw=0.6, ls=":")
        axes[1].set_ylabel("latency cut vs best eviction-free (%)")
        fig.suptitle("§4.5 O=B=4, M=max(2I, I+O-1)", fontsize=10)
        save(fig, "csp")
    if "rmax" in by:
        g = by["rmax"]
        outs = sorted(set(g["O"]))
        labs = sorted(set(g["label"]))
        fig, axes = plt.subplots(
            len(outs), len(labs), figsize=(3.6 * len(labs), 3.2 * len(outs)), squeeze=False
        )
        for r, o in enumerate(outs):
            for k, lab in enumerate(labs):
                ax = axes[r][k]
                gg = g[(g["O"] == o) & (g["label"] == lab)]
                for i, gi in gg.groupby("I"):
                    gi = gi.sort_values("R_max")
                    ax.plot(gi["R_max"], gi["tps"], marker="o", ms=3, label=f"I={i}")
                ax.set_xscale("log", base=2)
                ax.set_title(f"{lab}, O={o}", fontsize=9)
                ax.set_xlabel("R_max")
                ax.set_ylabel("TPS")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=6)
        fig.suptitle("§4.6 R_max sweep (Fig. 11)", fontsize=10)
        save(fig, "rmax")
    if "ranking" in by:
        g = by["ranking"]
        mixes = sorted(set(g["mix"]))
        ms = [
            ("latency_s", "latency (s)"),
            ("ttft_mean_s", "TTFT (s)"),
            ("tpot_mean_s", "TPOT (s)"),
        ]
        fig, axes = plt.subplots(
            len(ms), len(mixes), figsize=(3.2 * len(mixes), 8.5), squeeze=False
        )
        for j, mix in enumerate(mixes):
            for k, (col, name) in enumerate(ms):
                ax = axes[k][j]
                lines(ax, g[g["mix"] == mix], "B", col)
                ax.set_title(mix.removeprefix("infermax-") if k == 0 else "", fontsize=9)
                ax.set_ylabel(name if j == 0 else "")
                ax.set_xlabel("B" if k == len(ms) - 1 else "")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("A.3 ranking by I vs O (Figs. 15-17)", fontsize=10)
        save(fig, "ranking")
    return written


def replace_plan(plan: Plan, **changes: Any) -> Plan:
    """``plan`` with some fields changed (validated again)."""
    return replace(plan, **changes)
