"""Andes' parameters (:class:`AndesConfig`, Andes §4 and §6.5) and the helper that builds a
QoE policy's config from user parameters (:func:`config_from_params`, shared with LQSF).

Choices where the paper is vague (the other parameters are described where they are used:
:mod:`~sloserve.policies.andes.qoe_scheduler`, :mod:`~sloserve.policies.andes.scheduler`):

* **Δt** defaults to 1 s. The paper's Figure 19 finds QoE roughly flat in Δt with a
  workload-dependent best value, and so do we: on the cyclic-burst ShareGPT / Llama-2-7B
  scenario of ``tests/test_andes.py`` (16 req/s, R_max 1024, seed 0) mean QoE is 0.950,
  0.954, 0.951, 0.952, 0.949, 0.950 for Δt = 0.5, 1, 2, 3, 5, 10 s, while preemptions per
  request are lowest at 1 s (0.34 vs 1.36 at 2 s). At higher load (18 req/s) 2 s does
  better (mean over 5 seeds 0.951 vs 0.930): tune it per deployment, as the paper says.
* **Triggers** are the paper's (§4.2, "Selective Triggering"): KV occupancy above the
  watermark, or token latency above the most stringent reader's need. ``slot_trigger``
  (also trigger when the running requests fill ``watermark`` of R_max) is our extension and
  is off by default because it thrashes. Measured on ``sloserve demo``'s workload (bursty
  ShareGPT at 11 req/s on Llama-2-7B/A100, R_max 256, 600 s, seed 0), where KV never
  reaches the watermark and only R_max binds: with it, Andes preempts 9,013 times and
  mean QoE is 0.867 (vLLM 0.999); without it, 0 preemptions and 0.999. Under slot
  pressure the knapsack swaps buffered running requests for waiting ones (a zero-sum
  trade of slots that costs a recompute each time); the victims then sit at reading pace,
  mean E2E rises from 10 s to 52 s, so by Little's law five times as many requests are
  live, the slots stay full and the trigger never lets go.
* **Requests without a QoE spec** use ``default_ttft_s`` and ``default_tokens_per_s``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sloserve.core.errors import ConfigError
from sloserve.policies.andes.objectives import OBJECTIVE_ALIASES, OBJECTIVES

SolverName = Literal["greedy", "dp"]
ModeName = Literal["auto", "recompute", "swap"]


@dataclass(frozen=True)
class AndesConfig:
    """Parameters of the Andes policy (the package's modules describe the choices)."""

    delta_t: float = 1.0
    """Δt: the horizon (s) over which Q_serve and Q_wait are estimated."""
    watermark: float = 0.9
    """KV occupancy (and R_max fill, with ``slot_trigger``) that triggers the knapsack."""
    selective: bool = True
    """Selective triggering; False runs the knapsack at every iteration."""
    slot_trigger: bool = False
    """Also trigger when the running requests fill ``watermark`` of R_max (our extension,
    off by default: see the module docstring)."""
    solver: SolverName = "greedy"
    """``greedy`` (Algorithm 1) or ``dp`` (Algorithm 2, exact, slow)."""
    objective: str = "avg"
    """``avg`` (average QoE), ``max-min`` or ``perfect`` (appendix A)."""
    batch_min: int | None = None
    """Lower bound on the batch sizes searched (default: derived, see B_min)."""
    batch_max: int | None = None
    """Upper bound on the batch sizes searched (default: derived, see B_max)."""
    batch_candidates: int = 6
    """Batch sizes tried in [B_min, B_max] when that range is not a single point."""
    refiner: bool = True
    """The overhead-aware refiner (§4.3)."""
    refiner_victim_gains: bool = True
    """A pair's net QoE change also counts the gains its victims lose (False: only the
    loss the overhead inflicts on the running requests)."""
    preemption_mode: ModeName = "auto"
    """``auto`` (the cheaper of swap and recompute per request), ``recompute`` or ``swap``
    (falls back to recompute when the CPU tier is full)."""
    hybrid: bool = False
    """Decodes may share an iteration with (re)fills (False: as the vllm baseline)."""
    dp_memory_units: int = 256
    """KV quantisation for ``solver=dp`` (memory units of the DP table)."""
    default_ttft_s: float = 1.0
    """TTFT target for requests without a QoE spec."""
    default_tokens_per_s: float = 4.8
    """Reading speed for requests without a QoE spec (Andes' mean reading speed)."""

    def __post_init__(self) -> None:
        if not self.delta_t > 0:
            raise ValueError(f"delta_t must be > 0, got {self.delta_t}")
        if not 0 <= self.watermark <= 1:
            raise ValueError(f"watermark must be in [0, 1], got {self.watermark}")
        if self.solver not in ("greedy", "dp"):
            raise ValueError(f"solver must be greedy or dp, got {self.solver!r}")
        obj = OBJECTIVE_ALIASES.get(self.objective, self.objective)
        if obj not in OBJECTIVES:
            raise ValueError(
                f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}"
            )
        object.__setattr__(self, "objective", obj)
        for name in ("batch_min", "batch_max"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if (
            self.batch_min is not None
            and self.batch_max is not None
            and self.batch_min > self.batch_max
        ):
            raise ValueError("batch_min must be <= batch_max")
        if self.batch_candidates < 1:
            raise ValueError("batch_candidates must be >= 1")
        if self.preemption_mode not in ("auto", "recompute", "swap"):
            raise ValueError(
                f"preemption_mode must be auto, recompute or swap, got {self.preemption_mode!r}"
            )
        if self.dp_memory_units < 1:
            raise ValueError("dp_memory_units must be >= 1")
        if not self.default_ttft_s >= 0 or not self.default_tokens_per_s > 0:
            raise ValueError("default_ttft_s must be >= 0 and default_tokens_per_s > 0")


def config_from_params(cls: type[Any], policy: str, params: Mapping[str, Any]) -> Any:
    """Build a frozen config dataclass from user params; ConfigError on anything wrong."""
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ConfigError(
            f"policy {policy!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(valid))}"
        )
    try:
        return cls(**dict(params))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"policy {policy!r}: {e}") from e
