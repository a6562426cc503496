"""What ``sloserve reproduce andes`` runs (Andes §6.2–§6.4): the grid of simulations.

Experiments, each a grid of runs (one policy on one replica over one workload):

* ``intensity`` (Figure 15) and ``duration`` (Figure 16): one cycle of Andes' cyclic burst
  load (a burst of ``intensity`` × the mean rate for ``duration`` of the cycle, then a calm
  phase, Poisson within phases), the mean rate set to the replica's throughput without
  bursts, as §6.3 says. Intensity is "the ratio of request rate from burst to the entire
  trace", so it must stay below 1 / duration.
* ``poisson`` (Figure 20): Poisson arrivals at increasing multiples of that throughput.
* ``refiner`` (Figure 17), ``solver`` (Figure 18, greedy vs DP) and ``delta_t``
  (Figure 19): Andes ablations under the default burst.

The replica's throughput without bursts is measured, not assumed: the request rate vLLM
completes when the whole workload's requests are queued at once (a saturated replica).

:meth:`Plan.paper` is the paper's own scale (§6.1, Tables 1 and 2): Llama-3.1-70B and
Phi-3.5-MoE on 8× A100-40GB (priced from the catalog specs by the roofline model), Table 2's
Multi-Round ShareGPT lengths unclipped (both models have a 131,072-token context), and C
(tokens per iteration) raised to that context, as vLLM sets ``max_num_batched_tokens`` to
``max_model_len`` without chunked prefill: with C = 4,096 vLLM would reject every request
longer than 4,096 tokens (21% of this mix; 0.04% exceed the 131,072-token context and
are clipped to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sloserve.experiments.runner import InstanceConfig, SimConfig
from sloserve.workloads import WorkloadSpec

POLICIES = ("vllm", "sarathi", "lqsf", "andes")
PAPER_LLAMA = "llama-3.1-70b@a100-40gbx8"
PAPER_PHI = "phi-3.5-moe@a100-40gbx8"
PAPER_CONTEXT = 131_072
PAPER_MAX_RUNNING = 1024
"""Andes Table 1's testbed: each model tensor-parallel over 8× A100-40GB (AWS p4d.24xlarge),
and both models' context length. R_max is raised from vLLM's 256 so that KV memory binds,
as Andes' memory trigger assumes: with 256 slots Phi-3.5-MoE's 1.65M-token KV cache is 32%
used (time-weighted, vLLM at intensity 2), the slots bind, and Andes, triggered by memory
or token latency only, never engages (QoE 0.569, exactly vLLM's)."""


@dataclass(frozen=True)
class Scenario:
    """A replica profile and a length distribution (Andes Table 2 or another mix)."""

    profile: str
    mix: str


@dataclass(frozen=True)
class Plan:
    """The grid of one reproduction run."""

    scenarios: tuple[Scenario, ...]
    cycle_s: float
    intensities: tuple[float, ...]
    durations: tuple[float, ...]
    poisson_loads: tuple[float, ...]
    delta_ts: tuple[float, ...]
    ablations: bool
    seed: int = 0
    max_running: int = 256
    # DP is O(N·B·units): its ablation uses fewer memory units to stay affordable
    dp_units: int = 64
    # C, tokens per iteration: vLLM's max_num_batched_tokens (>= the longest request
    # without chunked prefill)
    max_batch_tokens: int = 4096

    @staticmethod
    def quick(seed: int = 0) -> Plan:
        return Plan(
            scenarios=(Scenario("llama-2-7b-a100", "andes-sharegpt"),),
            cycle_s=90.0,
            intensities=(1.5, 2.0, 2.5),
            durations=(0.35,),
            poisson_loads=(1.2,),
            delta_ts=(),
            ablations=True,
            seed=seed,
        )

    @staticmethod
    def paper(seed: int = 0, *, cycle_s: float = 1200.0) -> Plan:
        """The paper's models, GPUs and lengths (§6.1): the intensity and duration sweeps of
        §6.3 (Figures 15, 16) on both, no Poisson sweep or ablations (the paper runs those on
        Llama-3.1-70B only; ``full`` has them on the Llama-2 profiles). The cycle is 20
        minutes: §6.3 takes BurstGPT's bursts of 7 minutes on average, and 7 minutes is the
        default 35% duration of a 20-minute cycle."""
        return Plan(
            scenarios=(
                Scenario(PAPER_LLAMA, "andes-sharegpt"),
                Scenario(PAPER_PHI, "andes-sharegpt"),
            ),
            cycle_s=cycle_s,
            intensities=(1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75),
            durations=(0.1, 0.2, 0.35, 0.45),
            poisson_loads=(),
            delta_ts=(),
            ablations=False,
            seed=seed,
            max_running=PAPER_MAX_RUNNING,
            max_batch_tokens=PAPER_CONTEXT,
        )

    @staticmethod
    def full(seed: int = 0) -> Plan:
        return Plan(
            scenarios=(
                Scenario("llama-2-7b-a100", "andes-sharegpt"),
                Scenario("llama-2-7b-a100", "lmsys"),
                Scenario("llama-2-70b-a100x2", "andes-sharegpt"),
                Scenario("llama-2-70b-a100x2", "lmsys"),
            ),
            cycle_s=600.0,
            intensities=(1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75),
            durations=(0.1, 0.2, 0.35, 0.45),
            poisson_loads=(0.6, 0.8, 1.0, 1.2, 1.4, 1.6),
            delta_ts=(0.5, 1.0, 2.0, 5.0),
            ablations=True,
            seed=seed,
        )


@dataclass(frozen=True)
class Run:
    """One simulation of the grid."""

    experiment: str
    scenario: Scenario
    policy: str
    params: tuple[tuple[str, Any], ...]
    arrival: dict[str, Any]
    x: float
    label: str
    seed: int
    max_running: int
    duration_s: float
    trace: str | None = None
    max_batch_tokens: int = 4096

    def config(self) -> SimConfig:
        spec: dict[str, Any]
        if self.trace is not None:
            # a real BurstGPT log: its own arrivals and lengths, replayed x times faster
            spec = {
                "trace": self.trace,
                "trace_format": "burstgpt",
                "replay": {"speedup": self.x, "max_context": 4096},
                "duration_s": self.duration_s,
                "seed": self.seed,
            }
        else:
            spec = {
                "mix": self.scenario.mix,
                "arrival": self.arrival,
                "duration_s": self.duration_s,
                "seed": self.seed,
            }
        return SimConfig(
            workload=WorkloadSpec.model_validate(spec),
            instance=InstanceConfig(
                profile=self.scenario.profile,
                max_running=self.max_running,
                max_batch_tokens=self.max_batch_tokens,
            ),
            policy=self.policy,
            policy_params=dict(self.params),
        )


def plan_runs(plan: Plan, capacity: dict[Scenario, float]) -> list[Run]:
    runs: list[Run] = []

    def add(
        exp: str,
        sc: Scenario,
        policy: str,
        params: dict[str, Any],
        arrival: dict[str, Any],
        x: float,
        label: str,
    ) -> None:
        runs.append(
            Run(exp, sc, policy, tuple(sorted(params.items())), arrival, x, label, plan.seed,
                plan.max_running, plan.cycle_s, max_batch_tokens=plan.max_batch_tokens)
        )  # fmt: skip

    for sc in plan.scenarios:
        cap = capacity[sc]

        def burst(intensity: float, duration: float, cap: float = cap) -> dict[str, Any]:
            return {
                "kind": "bursty",
                "rate": cap,
                "intensity": intensity,
                "burst_fraction": duration,
                "period_s": plan.cycle_s,
            }

        for pol in POLICIES:
            for i in plan.intensities:
                add("intensity", sc, pol, {}, burst(i, 0.35), i, pol)
            for d in plan.durations:
                add("duration", sc, pol, {}, burst(2.0, d), d, pol)
            for load in plan.poisson_loads:
                add("poisson", sc, pol, {}, {"kind": "poisson", "rate": cap * load}, load, pol)
        if plan.ablations:
            for d in plan.durations or (0.35,):
                add("refiner", sc, "andes", {"refiner": True}, burst(2.0, d), d, "refiner on")
                add("refiner", sc, "andes", {"refiner": False}, burst(2.0, d), d, "refiner off")
            for i in plan.intensities[:2]:
                add("solver", sc, "andes", {"solver": "greedy"}, burst(i, 0.35), i, "greedy")
                add(
                    "solver",
                    sc,
                    "andes",
                    {"solver": "dp", "dp_memory_units": plan.dp_units},
                    burst(i, 0.35),
                    i,
                    "dp",
                )
            for dt in plan.delta_ts:
                add("delta_t", sc, "andes", {"delta_t": dt}, burst(2.0, 0.35), dt, f"Δt={dt:g}s")
    return runs


def burstgpt_runs(
    plan: Plan, path: str, speedups: tuple[float, ...] = (1.0, 2.0, 4.0)
) -> list[Run]:
    """Replay a BurstGPT CSV (§6.2's real-trace experiment) on the plan's first profile,
    for every policy, at a few speed-ups (one cycle's worth of time each)."""
    sc = Scenario(plan.scenarios[0].profile, "burstgpt")
    return [
        Run("burstgpt", sc, pol, (), {"kind": "trace"}, k, pol, plan.seed, plan.max_running,
            plan.cycle_s, trace=path, max_batch_tokens=plan.max_batch_tokens)
        for pol in POLICIES
        for k in speedups
    ]  # fmt: skip
