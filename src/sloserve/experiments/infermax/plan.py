"""What ``sloserve reproduce infermax`` runs: InferMax §4 and appendix A.3 (``papers/
infermax.txt``) in simulation, as a :class:`Plan` of :class:`Run` rows.

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
  ``sloserve.experiments.infermax.csp.csp_eviction_sweep`` when that module exists (its
  status and gap are kept in ``csp.parquet``; when it is missing the headline says so and
  the preset half of the analysis still runs).
* ``rmax`` (§4.6, Figure 11): R_max from 32 to 512 for O = 32 and O = 1024.
* ``ranking`` (appendix A.3, Figures 15–17): Rank_org / Rank_I / Rank_O on the six pairwise
  mixes of SISO, SILO, LISO, LILO, B from 16 to 1024.

InferMax's setting (§4.1): Llama-2-7B on an A100 (profile ``llama-2-7b-a100``), C = 4096,
M = 100K tokens, block size 1 (token-exact M), all requests present at t = 0 (offline), the
``oracle`` output-length predictor (eviction-free reservations and the ranking by O).

Choices where the paper is vague (all fields of :class:`Plan`):

* **R_max** is unlimited (= B) outside §4.6: §4.1 says it was raised "from 128 to
  unlimited" to expose the schedulers' own features.
* **No watermark** (``watermark = 0``): Algorithm 1's CanAllocate has none; vLLM's 1% would
  take 1,000 tokens off M = 100K and all of M = 100.
* **Rank_org** is the ranking preset's configuration (one group, Sarathi batching,
  preemptive) with FCFS order: "no prioritization by I or O". The mixes' requests are in
  the shuffled order the mix draws them (seeded).

``Plan.quick()`` finishes in under 2 minutes on two shared cores; ``Plan.full()`` is the
paper's grids (10–20 minutes on two cores).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.core.request import Request
from sloserve.costmodel.profile import load_profile
from sloserve.experiments.runner import InstanceConfig, SimConfig
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
    """Call the CSP sweep (needs ``sloserve.experiments.infermax.csp``)."""
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


def replace_plan(plan: Plan, **changes: Any) -> Plan:
    """``plan`` with some fields changed (validated again)."""
    return replace(plan, **changes)
