"""QLM's request completion time (RCT) estimator (§6, Equations 1–5 of ``papers/qlm.txt``).

Symbols (Table 1): Θ the instance's token throughput (output tokens/s at a full batch),
t_d the decode time per output token, ε the inefficiency factor of continuous batching,
τ_p the prefill time per prompt token. A group's output lengths are Normal(μ, σ).

- **Hardware profiling** (:func:`profile_instance`): "running the model with a single
  batch of requests on the specific GPU" — here a short simulated batch on a fresh copy of
  the replica (its own cost model, limits and policy): ``batch`` requests of ``prompt``
  tokens and ``output`` tokens at t=0. The batch is the *real* one (:func:`profile_batch`):
  as many requests as a loaded replica runs at once, R_max or what its KV cache holds at
  the profiling lengths, whichever is smaller (a batch of 32 measured a 16.8 ms decode
  step where a loaded Llama-2-7B/A100 replica takes ≈ 48 ms, and a throughput 25 % low);
  the profile keeps the KV capacity, so waiting times count slots at the workload's own
  mean length. τ_p = the batch's first-token time ÷ its prompt tokens; t_d = the cost
  model's decode iteration at that batch and mean context; Θ = output tokens ÷ makespan;
  ε = the mean measured per-token decode time ÷ t_d (≥ 1 when KV pressure preempts
  requests). Heterogeneous GPUs and models get their own numbers.
- **Workload profiling** (:class:`OutputLengthModel`): μ, σ per group key, fitted online
  (Welford) from finished requests, blended with a prior (``prior_mean``, ``prior_std``
  counted as ``prior_weight`` observations) until enough are seen.
- **Waiting time** (Eq. 2): work ahead ÷ Θ. Choice: the work of a group is its output
  tokens ÷ Θ *plus* its prompt tokens × τ_p (the paper counts output tokens only; with
  mega-prompts, W_C, the prompts dominate). Requests already on the instance delay a new
  one only beyond its free slots (:meth:`RCTEstimator.in_flight`): a continuous-batching
  replica with room starts a request at once, and a full one frees a slot every μ/Θ
  seconds on average (Θ/μ requests end per second).
- **Group completion** (Eq. 1, 4, 5): FCFS inside the group, so the max over its requests
  is its last request: it waits for the other n−1 (their work), then its prefill (the
  group's mean prompt × τ_p) and its decode μ·t_d·ε. Means and variances add
  (independent lengths): Var = (n−1)σ²/Θ² + (σ·t_d·ε)².
- **Chance constraint**: P(C ≤ deadline) ≥ α is tested with the normal quantile
  ``mean + z_α·sqrt(var)`` (not sample-average approximation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from sloserve.cluster.qlm.groups import GroupKey, RequestGroup
from sloserve.core.errors import ConfigError
from sloserve.core.request import Request
from sloserve.engine.instance import Instance


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """The RCT constants of one replica (its GPU, model and limits)."""

    prefill_s_per_token: float
    decode_s_per_token: float
    throughput_tokens_per_s: float
    inefficiency: float = 1.0
    kv_tokens: int = 0
    """The replica's KV cache in tokens: it runs at once what fits there (up to R_max);
    0 = unknown (R_max counts as its slots)."""
    batch: int = 0
    """The profiling batch's size (0: unknown)."""
    decode_s_single: float = 0.0
    """The cost model's decode step for one request at the batch's mean context (0:
    unknown): with :attr:`decode_s_per_token`, a batch-size latency model
    (:meth:`decode_at`)."""

    def decode_at(self, k: int) -> float:
        """Per-token decode time of a batch of ``k`` (inefficiency included): linear in
        the batch between one request and the profiled batch (a decode step reads the
        weights once and each request's KV cache), the profiled value from there on."""
        full = self.decode_s_per_token * self.inefficiency
        if self.batch <= 1 or self.decode_s_single <= 0 or k >= self.batch:
            return full
        f = (max(k, 1) - 1) / (self.batch - 1)
        return self.decode_s_single + f * (full - self.decode_s_single)


def profile_instance(inst: Instance, *, batch: int, prompt: int, output: int) -> HardwareProfile:
    """Run one batch on ``inst`` (a fresh instance on its own clock) and read the constants
    off it (module docstring). ``inst`` is consumed."""
    if batch < 1 or prompt < 1 or output < 2:
        raise ConfigError(
            f"profile batch: need batch>=1, prompt>=1, output>=2; got {batch}, {prompt}, {output}"
        )
    reqs = [
        Request(req_id=-(k + 1), arrival=0.0, num_prompt_tokens=prompt, true_output_len=output)
        for k in range(batch)
    ]
    for r in reqs:
        inst.add_request(r)
    inst.env.run()
    done = [r for r in reqs if r.finish_time is not None and r.first_token_time is not None]
    if not done:
        raise ConfigError("profile batch: the replica finished none of its profiling batch")
    first = max(r.first_token_time or 0.0 for r in done)
    makespan = max(r.finish_time or 0.0 for r in done)
    t_p = first / (len(done) * prompt)
    t_d = inst.cost_model.decode_time(len(done), len(done) * (prompt + output // 2))
    per_token = sum(
        ((r.finish_time or 0.0) - (r.first_token_time or 0.0)) / (output - 1) for r in done
    ) / len(done)
    eff = max(1.0, per_token / t_d) if t_d > 0 else 1.0
    theta = len(done) * output / makespan if makespan > 0 else math.inf
    t_1 = inst.cost_model.decode_time(1, prompt + output // 2)
    return HardwareProfile(t_p, t_d, theta, eff, inst.kv.capacity_tokens, len(done), t_1)


PROFILE_LENGTHS = (512, 256)
"""The profiling batch's prompt and output tokens per request."""


def profile_batch(inst: Instance, prompt: int, output: int) -> int:
    """The real batch of ``inst`` at these lengths: R_max, or the requests its KV cache
    holds at their full length when fewer (a loaded replica runs that many at once)."""
    fits = inst.kv.capacity_tokens // max(prompt + output, 1)
    return max(1, min(inst.limits.max_running, fits))


def profile_replica(inst: Instance) -> HardwareProfile:
    """:func:`profile_instance` at the replica's real batch (:func:`profile_batch`) with
    :data:`PROFILE_LENGTHS`."""
    p, o = PROFILE_LENGTHS
    return profile_instance(inst, batch=profile_batch(inst, p, o), prompt=p, output=o)


class OutputLengthModel:
    """Normal(μ, σ) of output lengths per group key, online, with a prior."""

    def __init__(self, prior_mean: float, prior_std: float, prior_weight: float) -> None:
        if not prior_mean > 0 or not prior_std >= 0 or not prior_weight >= 0:
            raise ConfigError(
                f"output prior: mean {prior_mean} must be > 0, std {prior_std} and weight "
                f"{prior_weight} >= 0"
            )
        self.prior = (prior_mean, prior_std, prior_weight)
        self._stats: dict[GroupKey, list[float]] = {}  # [n, mean, M2] (Welford)

    def observe(self, key: GroupKey, n_out: int) -> None:
        s = self._stats.setdefault(key, [0.0, 0.0, 0.0])
        s[0] += 1
        d = n_out - s[1]
        s[1] += d / s[0]
        s[2] += d * (n_out - s[1])

    def params(self, key: GroupKey) -> tuple[float, float]:
        """(μ, σ): the observations pooled with ``prior_weight`` prior observations."""
        m0, s0, w0 = self.prior
        n, mean, m2 = self._stats.get(key, (0.0, 0.0, 0.0))
        tot = n + w0
        if tot <= 0:
            return m0, s0
        mu = (w0 * m0 + n * mean) / tot
        # pooled second moment around the blended mean
        ex2 = (w0 * (s0 * s0 + m0 * m0) + m2 + n * mean * mean) / tot
        return mu, math.sqrt(max(ex2 - mu * mu, 0.0))


def z_of(alpha: float) -> float:
    """The normal quantile of the chance constraint's level α (0 < α < 1)."""
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha: must be in (0, 1), got {alpha}")
    return NormalDist().inv_cdf(alpha)


class RCTEstimator:
    """Completion-time distributions of groups on replicas (module docstring)."""

    def __init__(self, lengths: OutputLengthModel, alpha: float) -> None:
        self.lengths = lengths
        self.alpha = alpha
        self.z = z_of(alpha)
        self.prompt_mean = 0.0
        """Mean prompt tokens of the requests seen so far (:meth:`observe_prompt`)."""
        self._prompts = 0

    def observe_prompt(self, tokens: int) -> None:
        """A request arrived with ``tokens`` prompt tokens (the running mean)."""
        self._prompts += 1
        self.prompt_mean += (tokens - self.prompt_mean) / self._prompts

    def work(self, g: RequestGroup, hw: HardwareProfile) -> tuple[float, float]:
        """(mean, var) seconds of instance time group ``g`` puts ahead of later groups."""
        mu, sigma = self.lengths.params(g.key)
        th = hw.throughput_tokens_per_s
        return (
            g.size * mu / th + g.prompt_tokens * hw.prefill_s_per_token,
            g.size * sigma * sigma / (th * th),
        )

    def in_flight(
        self, outstanding: int, capacity: int, model_key: GroupKey | None, hw: HardwareProfile
    ) -> tuple[float, float]:
        """(mean, var) seconds before a replica holding ``outstanding`` requests in
        ``capacity`` slots (fewer when the KV cache holds fewer requests of the mean
        length) starts the next one: 0 with a free slot, else one request end
        (μ/Θ) per request beyond the free slots, the next one included."""
        mu, sigma = self.lengths.prior[:2] if model_key is None else self.lengths.params(model_key)
        th = hw.throughput_tokens_per_s
        # the slots are what runs at once: R_max, or fewer when the KV cache holds fewer
        # requests of the workload's mean length (prompt seen so far + mean output)
        slots = capacity
        if hw.kv_tokens > 0:
            slots = min(capacity, int(hw.kv_tokens // max(self.prompt_mean + mu, 1.0)))
        k = max(0, outstanding - max(slots, 1) + 1)
        return k * mu / th, k * sigma * sigma / (th * th)

    def completion(self, g: RequestGroup, hw: HardwareProfile) -> tuple[float, float]:
        """(mean, var) seconds from the group's start to its last request's end (Eq. 5)."""
        mu, sigma = self.lengths.params(g.key)
        th, td = hw.throughput_tokens_per_s, hw.decode_s_per_token * hw.inefficiency
        n = g.size
        mean = (n - 1) * mu / th + (g.prompt_tokens / max(n, 1)) * hw.prefill_s_per_token
        mean += mu * td
        var = (n - 1) * sigma * sigma / (th * th) + (sigma * td) ** 2
        return mean, var

    def quantile(self, mean: float, var: float) -> float:
        """The α-quantile of a Normal(mean, var) completion time."""
        return mean + self.z * math.sqrt(max(var, 0.0))


def r_squared(predicted: list[float], actual: list[float]) -> float | None:
    """Coefficient of determination of ``predicted`` against ``actual`` (None: < 2 points
    or no spread)."""
    if len(actual) < 2:
        return None
    mean = sum(actual) / len(actual)
    ss_tot = sum((a - mean) ** 2 for a in actual)
    if ss_tot <= 0:
        return None
    ss_res = sum((a - p) ** 2 for a, p in zip(actual, predicted, strict=True))
    return 1.0 - ss_res / ss_tot
