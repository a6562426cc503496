"""What ``sloserve reproduce aladdin`` runs (Aladdin §6.4, Fig. 11, in simulation).

A scenario is a model on a GPU with Table 2's SLOs; each router configuration (Aladdin's
best fit on its optimal worker, JSQ on the optimal worker, power-of-two on it, and vLLM's
default of a whole machine's GPUs in one worker with JSQ) is simulated with a fixed number
of workers at each arrival rate, and the fewest GPUs that meet the SLOs are searched.
Choices: ShareGPT lengths (the ``sharegpt`` mix: lognormal, right-skewed, prompts and
outputs clipped to the model's context), Poisson arrivals; an SLO is met when
TTFT ≤ the prefill SLO and ATGT ≤ the decode SLO (the paper's rule); "meets the SLOs" is an
attainment of at least ``target`` (0.99: one straggler in a short run does not decide; the
paper's Fig. 11 asks for 100 %).

The quick plan is the paper's headline setting as far as the simulator goes: Llama-2-70B on
the A100 testbed (4 × A100-80GB connected with PCIe: the ``a100-80gb-pcie`` GPU, whose
tensor-parallel all-reduces go over PCIe), Table 2's SLOs (1600 / 75 ms), Table 3's worker
(2 GPUs) against vLLM's default of all 4 GPUs in one worker, rates up to 20 req/s (the
paper's Fig. 13 quotes about 25 for its simulation). Aladdin runs with the paper's knobs
(γ = 0.5, θ = 0.9); with a fixed number of workers a request no worker can take goes to the
least loaded one (Aladdin never blocks a request, and a fixed cluster has no bin to open).
The ``aladdin-oracle`` arm is the same router told every true output length (§4.3's
question: how much do prediction errors cost).

Split-phase arms (Fig. 12, ``split``): prefill and decode workers of the optimal size; the
fewest *decode* GPUs meeting the SLOs are searched (the paper simulates only the decode
phase) with the prefill workers fixed at what keeps their utilisation at or under a half
(``⌈2·r·t_pre(mean prompt)⌉``, from the §3 prefill fit), the same for every arm; JSQ and
power-of-two route both phases, Aladdin places prompts on the prefill worker with the
fewest queued tokens and packs the decode workers by Algorithm 1 (§5.1). The quick plan
runs them at its top rate only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    """A model and GPU with Table 2's SLOs; ``tp`` the optimal worker (Table 3)."""

    name: str
    model: str
    gpu: str
    tp: int
    ttft_ms: float
    atgt_ms: float
    machine_gpus: int = 4
    """GPUs per machine: vLLM's default worker takes them all (the paper's testbeds)."""

    def profile(self, tp: int) -> str:
        return f"{self.model}@{self.gpu}" + (f"x{tp}" if tp > 1 else "")


@dataclass(frozen=True)
class Arm:
    """One router configuration: ``router`` on the optimal worker, or on a whole machine
    (``default_worker``); ``params`` are extra router parameters."""

    name: str
    router: str
    default_worker: bool = False
    params: tuple[tuple[str, object], ...] = ()
    split: bool = False
    """Split prefill/decode workers; the GPUs counted are the decode workers'."""


ARMS = (
    Arm("aladdin", "aladdin"),
    Arm("jsq-optimal", "least-outstanding"),
    Arm("power-of-two", "power-of-two"),
    Arm("vllm-default", "least-outstanding", default_worker=True),
)
ORACLE = Arm("aladdin-oracle", "aladdin", params=(("oracle_lengths", True),))
"""The oracle-length ablation: Aladdin told each request's true output length."""
SPLIT_ARMS = (
    Arm("aladdin-split", "aladdin", split=True),
    Arm("jsq-split", "least-outstanding", split=True),
    Arm("power-of-two-split", "power-of-two", split=True),
)


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[Scenario, ...]
    rates: tuple[float, ...]
    duration_s: float
    arms: tuple[Arm, ...] = ARMS
    target: float = 0.99
    gamma: float = 0.5
    theta: float = 0.9
    """Aladdin's knobs: the paper's defaults (γ = 0.5, θ = 0.9)."""
    max_workers: int = 24
    """The largest cluster searched; an arm that misses the target even there is reported
    with ``max_workers + 1`` workers and attainment 0 (a lower bound, not a count)."""
    seed: int = 0
    split_rates: tuple[float, ...] | None = None
    """The rates the split-phase arms run at (None: all of ``rates``)."""
    testbed: tuple[Scenario, ...] = ()
    """Scenarios run on one fixed machine against the rate (Figs. 9/10, ``testbed.py``)."""
    testbed_fractions: tuple[float, ...] = (0.25, 0.4, 0.55, 0.7, 0.85, 1.0)
    """Testbed rates as fractions of the machine's Eq. 6 capacity (``testbed.py``)."""
    planner_gap: bool = False
    """Item 9: set Eq. 7's N_w beside the capacity planner's minimum (``planner_gap.py``)."""
    whatif_extra_us: tuple[float | None, ...] = ()
    """Extra µs per all-reduce of vLLM's whole-machine worker to re-run it with (None: the
    break-even, where it decodes a lone request as slowly as Table 3's; ``whatif.py``)."""

    def rates_for(self, arm: Arm) -> tuple[float, ...]:
        return self.split_rates if arm.split and self.split_rates is not None else self.rates

    @classmethod
    def quick(cls, seed: int = 0) -> Plan:
        arms = (*ARMS, ORACLE, *SPLIT_ARMS)
        return cls(
            (SC_70B,),
            (5.0, 10.0, 20.0),
            30.0,
            arms=arms,
            max_workers=32,
            seed=seed,
            split_rates=(20.0,),
            testbed=(SC_70B,),
            testbed_fractions=(0.4, 0.6, 0.8),
            planner_gap=True,
            whatif_extra_us=(60.0, None),
        )

    @classmethod
    def full(cls, seed: int = 0) -> Plan:
        return cls(
            (
                Scenario("7b-a100", "llama-2-7b", "a100-80gb-pcie", 1, 400, 15),
                Scenario("13b-a100", "llama-2-13b", "a100-80gb-pcie", 1, 600, 30),
                SC_70B,
            ),
            (5.0, 10.0, 15.0, 20.0, 25.0),
            60.0,
            arms=(*ARMS, ORACLE, *SPLIT_ARMS),
            max_workers=32,
            seed=seed,
            testbed=TESTBEDS,
            planner_gap=True,
            whatif_extra_us=(60.0, None),
        )


SC_70B = Scenario("70b-a100", "llama-2-70b", "a100-80gb-pcie", 2, 1600, 75)
"""The paper's headline setting: Llama-2-70B on its PCIe A100 testbed (module docstring)."""

TESTBEDS = (
    SC_70B,
    Scenario("13b-a100", "llama-2-13b", "a100-80gb-pcie", 1, 600, 30),
    Scenario("7b-a100", "llama-2-7b", "a100-80gb-pcie", 1, 400, 15),
    Scenario("13b-v100", "llama-2-13b", "v100", 2, 800, 50),
    Scenario("7b-v100", "llama-2-7b", "v100", 1, 800, 30),
)
"""Figs. 9 (A100) and 10 (V100): Table 2's SLOs, Table 3's workers, 4-GPU machines. The
V100 profiles are the catalog's ``v100`` (SXM2-32GB, NVLink) roofline from its data sheet,
not calibrated to measurements."""
