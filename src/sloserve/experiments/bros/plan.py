"""What BROS' reproduction runs (§7): the experiments, their grid (:class:`Plan`), one
simulation of it (:class:`Run`) and the measured capacities the RT rates and BE batch
sizes are scaled by. Paper: ``/work/shared/papers/bros.txt``.

Experiments, each a grid of runs (one policy on one replica over one workload):

* ``hybrid`` (§7.2, Figures 10–11): real-time (RT) requests with the ShareGPT or
  LMSYS-Chat-1M length statistics of BROS Table 2 (mixes ``sharegpt``, ``lmsys``) arriving
  as a Poisson process for ``duration_s``, with the SLO preset ``bros`` (TTFT 0.4 s, TPOT
  0.2 s); best-effort (BE) requests from the synthetic distribution (``be-synthetic``)
  submitted in batches (``be_batch_s`` seconds of the replica's BE work), the next batch
  when every request of the previous one has completed (closed loop, until
  ``duration_s``). Reported per policy: RT normalized latency, RT TTFT and TPOT SLO
  attainment, BE throughput.
* ``micro`` (§7.3, Figure 12): the pure-RT microbenchmark, RT requests only; normalized
  latency and throughput.
* ``ablation`` (§7.4.1, Figure 13): ``bros`` against ``bros-nobicache`` (no bidirectional
  KV blocks; a request that cannot get blocks is recomputed) on the hybrid workload at one
  rate.
* ``be_batch`` (ours, not in the paper): ``bros``, ``vllm`` and ``rr`` on the first
  scenario at one RT rate for several BE batch sizes, since the paper does not give the
  size and the gaps to vLLM depend on it more than on anything else.
* ``overhead`` (§7.4.2, Figure 14): wall-clock time spent inside the policy's
  ``schedule()`` per iteration, against the simulated duration of that iteration, with 100
  and 1,000 requests queued (half RT, half one BE batch, all at t = 0).

Choices where the paper is vague (each is a field of :class:`Plan`):

* **Profiles.** The paper runs OPT-13B (TP 2, A100-40GB), OPT-30B (TP 4) and
  Llama-3-70B (TP 8, A100-80GB). The catalog has no OPT model; the full plan uses
  ``llama-2-13b@a100-40gbx2`` in place of OPT-13B, ``llama-3-70b@a100-80gbx8`` for the
  paper's Llama-3-70B, plus the calibrated ``llama-2-7b-a100`` and ``llama-2-70b-a100x2``.
* **RT rates.** The paper gives absolute rates per model only in its figures (up to
  15 req/s). We set them as fractions (``loads``) of the replica's RT capacity, measured,
  not assumed: the RT requests/s vLLM completes when ``capacity_n`` RT requests are queued
  at once.
* **BE batches.** The paper does not give the batch size. A Batch-API job holds
  thousands of requests, enough work to keep a replica busy for minutes. We size a batch
  in seconds of the replica's BE work, ``be_batch_s`` (100 s; 20 s in the quick plan),
  times its measured BE capacity (BE requests/s vLLM completes with ``capacity_n`` BE
  requests queued at once): 1,189 requests on Llama-2-7B/A100, 267 on
  Llama-2-70B/2×A100, so that a batch is as deep, in time, on every profile, like the RT
  rates. ``be_batch_size`` fixes the size instead. No gap between batches. The
  ``be_batch`` experiment shows how much the gaps to vLLM depend on this choice.
* **Microbenchmark.** The paper removes BROS' BE packing and bidirectional blocks and
  compares with vLLM and TGI. Without BE requests neither has anything to act on, so we run
  ``bros`` as is; TGI is not modelled, ``sarathi`` stands in as the second baseline.

The other choices are with the code they concern: BE throughput and aggregates in
:mod:`.reproduce`, the overhead timing in :mod:`.overhead`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sloserve.core.errors import ConfigError, SloserveError
from sloserve.experiments.runner import InstanceConfig, SimConfig, saturation_throughput
from sloserve.workloads import WorkloadSpec

HYBRID_POLICIES = ("bros", "vllm", "rr", "sarathi")
MICRO_POLICIES = ("bros", "vllm", "sarathi")
ABLATION_POLICIES = ("bros", "bros-nobicache")
OVERHEAD_POLICIES = ("bros", "vllm")
BE_BATCH_POLICIES = ("bros", "vllm", "rr")


@dataclass(frozen=True)
class Scenario:
    """A replica profile and the RT length distribution (BROS Table 2 mix)."""

    profile: str
    mix: str

    @property
    def key(self) -> str:
        return f"{self.profile}/{self.mix}"


@dataclass(frozen=True)
class Plan:
    """The grid of one reproduction run."""

    scenarios: tuple[Scenario, ...]
    loads: tuple[float, ...]
    """RT Poisson rates as fractions of the replica's measured RT capacity."""
    duration_s: float
    """Arrival window of RT requests and BE batches (the paper: 10-minute traces)."""
    be_batch_s: float = 100.0
    """Size of a BE batch, in seconds of the replica's BE capacity."""
    be_batch_size: int | None = None
    """A fixed BE batch size (requests) instead of ``be_batch_s``."""
    hybrid_policies: tuple[str, ...] = HYBRID_POLICIES
    micro_policies: tuple[str, ...] = MICRO_POLICIES
    micro_loads: tuple[float, ...] = ()
    ablation_policies: tuple[str, ...] = ABLATION_POLICIES
    ablation_load: float | None = None
    """The RT load of the ablation (None: no ablation)."""
    ablation_scenarios: tuple[Scenario, ...] = ()
    """Where the ablation runs (the paper: OPT-30B on 4 GPUs at 10 req/s): the profile with
    the least KV memory per unit of work. Bidirectional blocks only matter when an RT
    request finds no free block; see ``ablation_params`` to admit BE down to 0 free."""
    ablation_params: tuple[tuple[str, Any], ...] = ()
    """Policy parameters of both ablation variants, e.g. ``(("watermark", 0.0),)``."""
    overhead_policies: tuple[str, ...] = OVERHEAD_POLICIES
    be_batch_seconds: tuple[float, ...] = ()
    """BE batch sizes (as ``be_batch_s``) of the ``be_batch`` sensitivity runs."""
    be_batch_policies: tuple[str, ...] = BE_BATCH_POLICIES
    be_batch_load: float = 0.3
    overhead_queued: tuple[int, ...] = (100, 1000)
    overhead_iterations: int = 200
    overhead_profile: str = "llama-2-7b-a100"
    seed: int = 0
    max_running: int = 256
    block_size: int = 16
    capacity_n: int = 400

    @staticmethod
    def quick(seed: int = 0) -> Plan:
        """Under 2 minutes on 2 busy cores: one profile with both mixes and a second
        profile with ShareGPT, two rates, 60 s of arrivals, 20 s BE batches."""
        return Plan(
            scenarios=(
                Scenario("llama-2-7b-a100", "sharegpt"),
                Scenario("llama-2-7b-a100", "lmsys"),
                Scenario("llama-2-70b-a100x2", "sharegpt"),
            ),
            loads=(0.2, 0.4),
            duration_s=60.0,
            be_batch_s=20.0,
            micro_loads=(0.6,),
            be_batch_seconds=(5.0, 60.0),
            be_batch_policies=("bros", "vllm"),
            ablation_load=0.3,
            ablation_scenarios=(Scenario("llama-2-70b-a100x2", "sharegpt"),),
            overhead_iterations=100,
            seed=seed,
        )

    @staticmethod
    def full(seed: int = 0) -> Plan:
        """Four profiles × two mixes, five rates, the paper's 10-minute traces."""
        profiles = (
            "llama-2-7b-a100",
            "llama-2-13b@a100-40gbx2",
            "llama-2-70b-a100x2",
            "llama-3-70b@a100-80gbx8",
        )
        return Plan(
            scenarios=tuple(Scenario(p, m) for p in profiles for m in ("sharegpt", "lmsys")),
            loads=(0.1, 0.2, 0.3, 0.4, 0.5),
            duration_s=600.0,
            micro_loads=(0.2, 0.4, 0.6, 0.8, 1.0),
            be_batch_seconds=(5.0, 20.0, 100.0, 400.0),
            ablation_load=0.3,
            ablation_scenarios=(
                Scenario("llama-2-70b-a100x2", "sharegpt"),
                Scenario("llama-2-70b-a100x2", "lmsys"),
            ),
            overhead_iterations=300,
            seed=seed,
        )

    def with_policies(self, policies: Sequence[str]) -> Plan:
        """The same grid restricted to ``policies`` (each experiment keeps its order)."""
        keep = set(policies)

        def f(ps: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(p for p in ps if p in keep)

        return replace(
            self,
            hybrid_policies=f(self.hybrid_policies),
            micro_policies=f(self.micro_policies),
            ablation_policies=f(self.ablation_policies),
            overhead_policies=f(self.overhead_policies),
            be_batch_policies=f(self.be_batch_policies),
        )

    def policies(self) -> list[str]:
        seen: dict[str, None] = {}
        for ps in (
            self.hybrid_policies,
            self.micro_policies,
            self.ablation_policies,
            self.overhead_policies,
            self.be_batch_policies,
        ):
            seen.update(dict.fromkeys(ps))
        return list(seen)


@dataclass(frozen=True)
class Run:
    """One simulation of the grid."""

    experiment: str
    scenario: Scenario
    policy: str
    load: float
    rate: float
    duration_s: float
    be_batch_size: int | None
    seed: int
    max_running: int
    block_size: int
    params: tuple[tuple[str, Any], ...] = ()
    """Policy parameters (sorted name/value pairs)."""

    def config(self) -> SimConfig:
        spec: dict[str, Any] = {
            "mix": self.scenario.mix,
            "arrival": {"kind": "poisson", "rate": self.rate},
            "duration_s": self.duration_s,
            "slo": "bros",
            "seed": self.seed,
        }
        if self.be_batch_size is not None:
            spec["batch_jobs"] = {"mix": "be-synthetic", "batch_size": self.be_batch_size}
        return SimConfig(
            workload=WorkloadSpec.model_validate(spec),
            instance=InstanceConfig(
                profile=self.scenario.profile,
                max_running=self.max_running,
                block_size=self.block_size,
            ),
            policy=self.policy,
            policy_params=dict(self.params),
        )


class RunFailed(SloserveError):
    """A run of the grid ended with a typed error (a policy's violation, a stall, …); the
    message names the run. One string argument, so it crosses process boundaries (some
    typed errors take several arguments and cannot be unpickled)."""


def rt_capacity(
    scenario: Scenario, *, n: int = 400, seed: int = 0, max_running: int = 256
) -> float:
    """RT requests/s vLLM completes when ``n`` RT requests of the mix are queued at once."""
    return saturation_throughput(
        scenario.mix, scenario.profile, n=n, seed=seed, max_running=max_running
    )


def be_capacity(profile: str, *, n: int = 400, seed: int = 0, max_running: int = 256) -> float:
    """BE requests/s vLLM completes when ``n`` BE requests (``be-synthetic``) are queued."""
    return rt_capacity(Scenario(profile, "be-synthetic"), n=n, seed=seed, max_running=max_running)


def batch_size(plan: Plan, be_cap: float, seconds: float | None = None) -> int:
    """The BE batch size of a replica with BE capacity ``be_cap`` requests/s."""
    if seconds is None and plan.be_batch_size is not None:
        return plan.be_batch_size
    return max(1, round((plan.be_batch_s if seconds is None else seconds) * be_cap))


def plan_runs(
    plan: Plan, capacity: dict[Scenario, float], be_cap: dict[str, float] | None = None
) -> list[Run]:
    """Every simulation of the plan (the overhead benchmark is separate). ``capacity`` is
    each scenario's RT capacity, ``be_cap`` each profile's BE capacity (requests/s; needed
    unless the plan fixes ``be_batch_size`` and has no ``be_batch`` sweep)."""
    runs: list[Run] = []

    def bcap(profile: str) -> float:
        if be_cap is None or profile not in be_cap:
            raise ConfigError(f"no BE capacity for profile {profile!r}")
        return be_cap[profile]

    def size(profile: str) -> int:
        if plan.be_batch_size is not None:
            return plan.be_batch_size
        return batch_size(plan, bcap(profile))

    def add(
        exp: str,
        sc: Scenario,
        pol: str,
        load: float,
        be: int | None,
        params: tuple[tuple[str, Any], ...] = (),
    ) -> None:
        runs.append(
            Run(exp, sc, pol, load, capacity[sc] * load, plan.duration_s, be, plan.seed,
                plan.max_running, plan.block_size, params)
        )  # fmt: skip

    for sc in plan.scenarios:
        for pol in plan.hybrid_policies:
            for load in plan.loads:
                add("hybrid", sc, pol, load, size(sc.profile))
        for pol in plan.micro_policies:
            for load in plan.micro_loads:
                add("micro", sc, pol, load, None)
    if plan.be_batch_seconds and plan.scenarios:
        sc = plan.scenarios[0]
        for pol in plan.be_batch_policies:
            for secs in plan.be_batch_seconds:
                add("be_batch", sc, pol, plan.be_batch_load,
                    batch_size(plan, bcap(sc.profile), secs))  # fmt: skip
    if plan.ablation_load is not None:
        params = tuple(sorted(plan.ablation_params))
        for sc in plan.ablation_scenarios:
            for pol in plan.ablation_policies:
                add("ablation", sc, pol, plan.ablation_load, size(sc.profile), params)
    return runs


def validate_plan(plan: Plan) -> None:
    """Fail before simulating anything: unknown policies or profiles, empty grids."""
    from sloserve.costmodel.profile import load_profile
    from sloserve.policies.registry import make_policy
    from sloserve.workloads import get_mix

    if not plan.scenarios:
        raise ConfigError("reproduce bros: no scenario (profile × mix) to run")
    for p in plan.policies():
        make_policy(p)
    for sc in (*plan.scenarios, *plan.ablation_scenarios):
        load_profile(sc.profile)
        get_mix(sc.mix)
    if plan.overhead_policies:
        load_profile(plan.overhead_profile)
    if any(x <= 0 for x in (*plan.loads, *plan.micro_loads)):
        raise ConfigError("reproduce bros: loads must be > 0")
    if not (plan.hybrid_policies or plan.micro_policies or plan.ablation_policies):
        raise ConfigError("reproduce bros: no policy left to simulate")
