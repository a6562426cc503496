"""What ``sloserve reproduce qlm`` runs (§8 of ``papers/qlm.txt``, scaled to a simulation).

Workloads (choices; the paper's exact traces and GPU counts are not reproducible here):

- **W_A, multi-model**: three models (Llama-2-7B, Phi-2, Llama-3-8B) on two A100
  replicas that start with the first two: more models than instances, one tail model
  (30 %) that no replica serves at first. ShareGPT lengths, Poisson arrivals.
- **W_B, single-model multi-SLO**: Llama-2-7B on two A100 replicas, past their capacity
  (queues build up), latency-sensitive (``rt``, 30 s deadline) and batch (``be``, 300 s).
- **W_C, mega-prompts** (the ``mega`` sweep): W_B's requests with a share of them made
  mega-prompts (:data:`MEGA_PROMPT`, 3,500 + 500 tokens: Llama-2's 4k context), chosen by
  a seeded draw.

- **W_A_large** (the ``large`` sweep): W_A with the paper's model sizes
  (:data:`W_A_LARGE`).

Where this setup differs from the paper's (§8), and which gap each difference can explain
(docs/papers/qlm.md, "Where our setup differs"):

- *Scale*: two simulated replicas (four in the ``a10`` sweep) against 80–100 GPUs; few
  queues leave load balancing little to choose.
- *Models*: W_A serves 2.7–8B models (cold loads 3–9 s) where the paper serves
  Mistral-7B, Vicuna-13B and Llama-70B (a 70B cold load ≈ 72 s): the warm-start gap.
  W_A_large restores the sizes.
- *Backend*: a simulated vLLM-like engine, R_max = 256 continuous-batching slots and a
  KV cache that holds ≈ 155 Llama-2-7B requests of 768 tokens on an A100: a slot frees
  every few tens of ms, so a waiting rt request is rarely blocked by the running batch —
  the eviction gap and most of the single-model gap vs EDF.
- *Baselines*: the paper's EDF is "sorted by SLO values" per instance with no eviction;
  ``edf-swap`` sorts by absolute deadline (the same order for two classes within a 40 s
  window) and runs vLLM's policy (no eviction, recompute on KV overflow). The paper does
  not say how its baselines spread requests over instances (we rotate).
- *Lengths and rates*: the workload's named ``sharegpt`` length mix and
  Poisson arrivals for 40 s (quick) or 120 s (full), where the paper replays ShareGPT
  with unstated rates.
- *Throughput*: the claims count requests finished within the arrival window ÷ the window
  (§8.1: "requests served per second"; ``experiments/qlm/headline.py``); the summary's
  output tokens ÷ the time to the last finish stays beside it (when every system drains
  the queue before the horizon, that one differs only by the makespan).

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
NAIVE_AFFINE = ("fcfs-swap-affine", "edf-swap-affine")
"""The same with model-aware assignment (``assign: model``): only tail models swap."""
BASELINES = ("edf", "fcfs", "round-robin", *NAIVE_SWAP, *NAIVE_AFFINE)
SHEPHERD = "static-batch"
"""The SHEPHERD-like static-batch baseline (``cluster/qlm/static.py``): single-model
runs only (it never changes a replica's model)."""
AGENT_ONLY = "edf-qlm-agent"
"""``edf`` (a global EDF queue) with QLM's per-instance agent (policy ``qlm``: EDF,
chunked prefill, eviction/swap) instead of vLLM's: what the agent alone gives, for the
queue and mega-prompt sweeps' attribution."""
TAIL_SHARE = 0.3
"""W_A's share of requests to its tail model (the main grid)."""
A10_REPLICAS = 4
A100_ROOFLINE = "roofline:llama-2-7b@a100-80gb"
A10_ROOFLINE = "roofline:llama-2-7b@a10"
"""The ``a10`` sweep's profiles: both from the roofline (the catalog's A10 data sheet:
24 GB, 600 GB/s, 125 dense fp16 TFLOPS; no measured A10 profile exists), so the A10:A100
gap is the data sheets' and not a roofline-vs-measurement artefact."""
W_A_LARGE = "W_A_large"
"""W_A with the paper's models (§8: Mistral-7B, Vicuna-13B, Llama-70B; Vicuna-13B is a
Llama-2-13B fine-tune, so its spec): two replicas of two A100-80GB each (tensor parallel 2,
the least that holds Llama-2-70B's 138 GB), starting with Mistral-7B and Llama-2-13B;
Llama-2-70B is the tail model. All three priced by the roofline (no measured TP-2
profiles), so they compare among themselves. Cold loads: 7.5, 13.5 and 71.7 s; warm
(from CPU memory): 0.29, 0.52 and 2.76 s; reading Llama-2-70B into CPU memory: 69 s."""
W_A_LARGE_RATE = 7.0
"""W_A_large's arrival rate (req/s): the offered load of W_A at 14 req/s. Per request, the
profiled output throughput Θ gives the replica-seconds it costs; W_A's mix costs 0.082
replica-s per 250 output tokens (≈ 24 req/s on two replicas: 14 req/s is 58 %), this
one's 0.173 (≈ 11.6 req/s: 58 % is 6.7, rounded to 7)."""
_MULTI_MODEL: dict[str, tuple[tuple[str, str], ...]] = {
    "W_A": (
        ("llama-2-7b", "llama-2-7b-a100"),
        ("phi-2", "phi-2-a100"),
        ("llama-3-8b", "llama-3-8b-a100"),
    ),
    W_A_LARGE: (
        ("mistral-7b", "roofline:mistral-7b@a100-80gbx2"),
        ("llama-2-13b", "roofline:llama-2-13b@a100-80gbx2"),
        ("llama-2-70b", "roofline:llama-2-70b@a100-80gbx2"),
    ),
}
"""The multi-model workloads' (model, profile): two head models sharing ``1 - tail`` 4:3,
then the tail model, which no replica serves at the start."""


def tail_model(workload: str) -> str | None:
    """The multi-model workload's tail model (the one no replica serves at first)."""
    models = _MULTI_MODEL.get(workload)
    return None if models is None else models[-1][0]


QUEUED_RATE = 80.0
"""W_B's queued point (req/s): twice the main grid's 40, where a global queue builds."""
A10_RATE = 50.0
MEGA_RATE = 30.0
MEGA_PROMPT = (3500, 500)
"""A W_C mega-prompt: 3,500 prompt and 500 output tokens (Llama-2's 4k context)."""


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
    sweep: str = "main"
    """Which table the run belongs to: ``main`` (the systems grid), ``queue`` (W_B's arrival
    rate), ``tail`` (W_A's tail-model share), ``a10`` (the A10:A100 mix), ``mega`` (W_C's
    mega-prompt share), ``large`` (W_A with the paper's model sizes), ``sustained`` (W_A_large's
    warm-start pair over longer arrivals and several seeds); the group-size and
    burstiness runs keep ``main``'s label and are told apart by their knob."""
    tail_share: float = TAIL_SHARE
    """W_A: the share of requests to the tail model (Llama-3-8B, served by no replica at
    first); the two frequent models split the rest 4:3."""
    a10_share: float = 0.0
    """``a10`` sweep: the share of the four replicas that are A10s (the rest A100s)."""
    mega_share: float = 0.0
    """W_C: the share of requests that are mega-prompts (:data:`MEGA_PROMPT`)."""
    swap: str | None = None
    """QLM's ``router_params.swap`` (``drain``/``flush``); None: the router's default."""

    @property
    def key(self) -> str:
        return (
            (
                f"{self.workload}/{self.system}/rt={self.rt_share}/gsf={self.group_size_factor}"
                f"/cv={self.arrival_cv}/rate={self.rate}/tail={self.tail_share}"
                f"/a10={self.a10_share}/mega={self.mega_share}"
            )
            + (f"/swap={self.swap}" if self.swap is not None else "")
            + (f"/seed={self.seed}/dur={self.duration_s}" if self.sweep == "sustained" else "")
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
        multi = _MULTI_MODEL.get(self.workload)
        if multi is not None:  # the two head models start on one replica each
            (m1, p1), (m2, p2), (tail, pt) = multi
            rest = 1.0 - self.tail_share
            wl["models"] = {m1: rest * 4 / 7, m2: rest * 3 / 7, tail: self.tail_share}
            cluster = {
                "replicas": [{"count": 1, "profile": p1}, {"count": 1, "profile": p2}],
                "models": {tail: {"profile": pt}},
            }
        if self.sweep == "a10":
            n_a10 = round(A10_REPLICAS * self.a10_share)
            groups = [
                {"count": n, "profile": prof}
                for n, prof in ((A10_REPLICAS - n_a10, A100_ROOFLINE), (n_a10, A10_ROOFLINE))
                if n > 0
            ]
            cluster = {"replicas": groups}
        system = self.system
        router = "qlm" if system.startswith("qlm") else system
        if system == "qlm-rr":
            router = "round-robin"  # QLM's per-instance policy behind round-robin (§8.3)
        if system == AGENT_ONLY:
            router = "edf"  # our global EDF with QLM's per-instance agent: attribution
        params: dict[str, Any] = {"group_size_factor": self.group_size_factor}
        policy_params: dict[str, Any] = {}
        if system == "qlm-no-warm-start":
            params["lsos"] = "pull,balance"
        elif system == "qlm-no-pull":
            params["lsos"] = "balance,warm-start"
        elif system == "qlm-no-eviction":
            policy_params["evict"] = False
        if self.swap is not None:
            params["swap"] = self.swap
        if router != "qlm":
            params = {}
        if system.endswith("-affine"):
            router = system.removesuffix("-affine")
            params = {"assign": "model"}
        cluster = {**cluster, "router": router, "router_params": params}
        sim: dict[str, Any] = {
            "workload": wl,
            # a horizon: requests held for a model no replica will serve end there
            "horizon_s": self.duration_s * 4,
            "policy": "qlm" if system.startswith("qlm") or system == AGENT_ONLY else "vllm",
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
    queue_rates: tuple[float, ...] = ()
    """The queue-size sweep (§8.3): W_B at these arrival rates (req/s; the main grid's is
    its first point), QLM vs the paper's baselines and ``edf``."""
    tail_shares: tuple[float, ...] = ()
    """Fig. 10's x-axis: W_A at these tail-model shares (the main grid's is 0.3)."""
    a10_shares: tuple[float, ...] = ()
    """Fig. 16: the share of A10s among four Llama-2-7B replicas, QLM vs round-robin with
    QLM's per-instance policy (``qlm-rr``), at :data:`A10_RATE`."""
    mega_shares: tuple[float, ...] = ()
    """Fig. 16: W_C at these mega-prompt shares."""
    large_tails: tuple[float, ...] = (TAIL_SHARE,)
    """:data:`W_A_LARGE` (the paper's model sizes) at these tail-model shares, at
    :data:`W_A_LARGE_RATE` (sweep ``large``)."""
    sustained_seeds: int = 5
    sustained_s: float = 120.0
    """Sweep ``sustained``: W_A_large, QLM with and without warm start, arrivals for
    ``sustained_s`` seconds, at seeds ``seed .. seed + sustained_seeds - 1``. The quick
    plan's 40 s window is shorter than the 69 s read of Llama-2-70B into CPU memory, so
    its warm-start gain counts the tail work QLM puts off; this window is longer."""
    runs: list[Run] = field(default_factory=list)

    @classmethod
    def quick(cls, seed: int = 0) -> Plan:
        return cls(
            (0.5,),
            40.0,
            {"W_A": 14.0, "W_B": 40.0},
            (1.0, 8.0),
            seed,
            (10, 100, 1000),
            queue_rates=(QUEUED_RATE,),
            a10_shares=(0.5,),
            mega_shares=(0.1,),
        ).built()

    @classmethod
    def full(cls, seed: int = 0) -> Plan:
        return cls(
            (0.2, 0.5, 0.8),
            120.0,
            {"W_A": 14.0, "W_B": 40.0},
            (0.5, 1.0, 4.0, 16.0),
            seed,
            (10, 100, 1000, 1563),
            burst_cvs=(2.0, 4.0),
            queue_rates=(60.0, QUEUED_RATE, 120.0),
            tail_shares=(0.05, 0.1, 0.2),
            a10_shares=(0.0, 0.25, 0.5, 0.75, 1.0),
            mega_shares=(0.0, 0.05, 0.1, 0.2, 0.4),
            large_tails=(0.05, TAIL_SHARE),
        ).built()

    def built(self) -> Plan:
        if not self.rt_shares or any(not 0 <= s <= 1 for s in self.rt_shares):
            raise ConfigError(f"rt_shares: each must be in [0, 1], got {self.rt_shares}")
        runs: list[Run] = []
        for wl, rate in self.rates.items():
            systems = ["qlm", *(b for b in BASELINES if wl == "W_A" or b not in NAIVE_AFFINE)]
            systems += {
                "W_A": ["qlm-no-warm-start"],
                "W_B": [SHEPHERD, "qlm-no-eviction", "qlm-no-pull"],
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
        runs += self._sweeps(mid)
        object.__setattr__(self, "runs", runs)
        return self

    def _sweeps(self, mid: float) -> list[Run]:
        """The §8.3 sweeps beyond the main grid (each point's systems)."""
        d, seed = self.duration_s, self.seed
        runs = [
            Run("W_B", s, mid, r, d, seed, sweep="queue")
            for r in self.queue_rates
            for s in ("qlm", "edf", *NAIVE_SWAP, SHEPHERD, "qlm-no-eviction", AGENT_ONLY)
        ]
        runs += [
            Run("W_A", s, mid, self.rates["W_A"], d, seed, sweep="tail", tail_share=t)
            for t in self.tail_shares
            for s in ("qlm", "edf", *NAIVE_SWAP, *NAIVE_AFFINE)
        ]
        runs += [
            Run("W_B", s, mid, A10_RATE, d, seed, sweep="a10", a10_share=a)
            for a in self.a10_shares
            for s in ("qlm", "qlm-rr")
        ]
        runs += [
            Run("W_C", s, mid, MEGA_RATE, d, seed, sweep="mega", mega_share=m)
            for m in self.mega_shares
            for s in ("qlm", "edf", *NAIVE_SWAP, AGENT_ONLY)
        ]
        runs += [
            Run(W_A_LARGE, s, mid, W_A_LARGE_RATE, d, seed, sweep="large", tail_share=t)
            for t in self.large_tails
            for s in ("qlm", "qlm-no-warm-start", "edf", *NAIVE_SWAP)
        ]
        runs += [
            Run(W_A_LARGE, s, mid, W_A_LARGE_RATE, self.sustained_s, seed + k, sweep="sustained")
            for k in range(self.sustained_seeds)
            for s in ("qlm", "qlm-no-warm-start")
        ]
        return runs
