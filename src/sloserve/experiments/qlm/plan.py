"""What ``sloserve reproduce qlm`` runs (§8 of ``papers/qlm.txt``, scaled to a simulation).

Workloads (choices; the paper's exact traces and GPU counts are not reproducible here):

- **W_A, multi-model**: three models (Llama-2-7B, Phi-2, Llama-3-8B) on two A100
  replicas that start with the first two: more models than instances, one tail model
  (30 %) that no replica serves at first. ShareGPT lengths, Poisson arrivals.
- **W_B, single-model multi-SLO**: Llama-2-7B on two A100 replicas, past their capacity
  (queues build up), latency-sensitive (``rt``, 30 s deadline) and batch (``be``, 300 s).
- **W_C, mega-prompts** (full plan only): W_B with heavy-tailed prompts (lognormal, mean
  1,500, std 3,000 tokens, clipped to Llama-2's 4k context; the paper's 8k-token
  mega-prompts do not fit this model).

Each workload runs QLM (router ``qlm``, policy ``qlm``) and the baselines of the same
runs: ``edf`` and ``fcfs`` (global queues, vLLM per replica) and ``round-robin`` (vLLM's
per-instance FCFS), and the paper's own, ``fcfs-swap`` and ``edf-swap`` (vLLM per-replica
FCFS/EDF queues that change model whenever the head's differs), over the share of
latency-sensitive requests (Fig. 10/13). Ablations (QLM minus one LSO): ``no-warm-start``
(W_A; ``lsos: pull,balance``), ``no-eviction`` (W_B; policy ``evict: false``), ``no-pull``
(W_B; ``lsos: balance,warm-start``). The group-size trade-off sweeps ``group_size_factor`` on W_B.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sloserve.core.errors import ConfigError

NAIVE_SWAP = ("fcfs-swap", "edf-swap")
"""The paper's §8 baselines: vLLM per-replica queues with naive model swapping."""
BASELINES = ("edf", "fcfs", "round-robin", *NAIVE_SWAP)
MULTI_MODELS = {"llama-2-7b": 0.4, "phi-2": 0.3, "llama-3-8b": 0.3}


@dataclass(frozen=True)
class Run:
    """One simulation: a workload, a system (router + policy + params), a knob value."""

    workload: str
    system: str
    rt_share: float
    rate: float
    duration_s: float
    seed: int
    group_size_factor: float = 4.0
    arrival_cv: float = 1.0
    """Burstiness: the CV of the inter-arrival gaps (1: Poisson; above: gamma, burstier)."""

    @property
    def key(self) -> str:
        return (
            f"{self.workload}/{self.system}/rt={self.rt_share}/gsf={self.group_size_factor}"
            f"/cv={self.arrival_cv}"
        )

    def config(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The run's (SimConfig mapping, ClusterConfig mapping)."""
        wl: dict[str, Any] = {
            "arrival": {"kind": "poisson", "rate": self.rate}
            if self.arrival_cv == 1.0
            else {"kind": "gamma", "rate": self.rate, "cv": self.arrival_cv},
            "duration_s": self.duration_s,
            "slo": "qlm",
            "classes": {"rt": self.rt_share, "be": 1.0 - self.rt_share},
            "seed": self.seed,
        }
        cluster: dict[str, Any] = {"replicas": [{"count": 2, "profile": "llama-2-7b-a100"}]}
        if self.workload == "W_A":
            wl["models"] = MULTI_MODELS
            cluster = {
                "replicas": [
                    {"count": 1, "profile": "llama-2-7b-a100"},
                    {"count": 1, "profile": "phi-2-a100"},
                ],
                "models": {"llama-3-8b": {"profile": "llama-3-8b-a100"}},
            }
        if self.workload == "W_C":
            # mega-prompts: a heavy prompt tail up to Llama-2's 4k context
            wl["prompt"] = {"kind": "lognormal", "mean": 1500, "std": 3000, "max": 3800}
            wl["max_context"] = 4096
        system = self.system
        router = "qlm" if system.startswith("qlm") else system
        params: dict[str, Any] = {"group_size_factor": self.group_size_factor}
        policy_params: dict[str, Any] = {}
        if system == "qlm-no-warm-start":
            params["lsos"] = "pull,balance"
        elif system == "qlm-no-pull":
            params["lsos"] = "balance,warm-start"
        elif system == "qlm-no-eviction":
            policy_params["evict"] = False
        if router != "qlm":
            params = {}
        cluster = {**cluster, "router": router, "router_params": params}
        sim: dict[str, Any] = {
            "workload": wl,
            # a horizon: requests held for a model no replica will serve end there
            "horizon_s": self.duration_s * 4,
            "policy": "qlm" if router == "qlm" else "vllm",
            "policy_params": policy_params,
        }
        return sim, cluster


@dataclass(frozen=True)
class Plan:
    """The grid (:meth:`quick` under a minute on two cores, :meth:`full` a few minutes)."""

    rt_shares: tuple[float, ...]
    duration_s: float
    rates: dict[str, float]
    group_factors: tuple[float, ...]
    seed: int = 0
    plan_sizes: tuple[int, ...] = (10, 100, 1000)
    burst_cvs: tuple[float, ...] = (4.0,)
    """The burstiness sweep: W_B at these inter-arrival CVs, QLM vs ``edf`` and
    ``fcfs-swap`` (the CV-1 point is the main grid's)."""
    runs: list[Run] = field(default_factory=list)

    @classmethod
    def quick(cls, seed: int = 0) -> Plan:
        return cls(
            (0.5,), 40.0, {"W_A": 14.0, "W_B": 40.0}, (1.0, 8.0), seed, (10, 100, 1000)
        ).built()

    @classmethod
    def full(cls, seed: int = 0) -> Plan:
        return cls(
            (0.2, 0.5, 0.8),
            120.0,
            {"W_A": 14.0, "W_B": 40.0, "W_C": 20.0},
            (0.5, 1.0, 4.0, 16.0),
            seed,
            (10, 100, 1000, 1563),
        ).built()

    def built(self) -> Plan:
        if not self.rt_shares or any(not 0 <= s <= 1 for s in self.rt_shares):
            raise ConfigError(f"rt_shares: each must be in [0, 1], got {self.rt_shares}")
        runs: list[Run] = []
        for wl, rate in self.rates.items():
            systems = ["qlm", *BASELINES]
            systems += {
                "W_A": ["qlm-no-warm-start"],
                "W_B": ["qlm-no-eviction", "qlm-no-pull"],
            }.get(wl, [])
            for share in self.rt_shares:
                for s in systems:
                    runs.append(Run(wl, s, share, rate, self.duration_s, self.seed))
        mid = self.rt_shares[len(self.rt_shares) // 2]
        for cv in self.burst_cvs:
            if cv != 1.0:
                for s in ("qlm", "edf", "fcfs-swap"):
                    runs.append(
                        Run("W_B", s, mid, self.rates["W_B"], self.duration_s, self.seed,
                            arrival_cv=cv)
                    )  # fmt: skip
        for f in self.group_factors:
            if f != 4.0:
                runs.append(
                    Run(
                        "W_B",
                        "qlm",
                        self.rt_shares[len(self.rt_shares) // 2],
                        self.rates["W_B"],
                        self.duration_s,
                        self.seed,
                        f,
                    )
                )
        object.__setattr__(self, "runs", runs)
        return self
