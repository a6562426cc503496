"""BROS' parameters (§4.2, §5): :class:`BROSConfig`, read by :mod:`.scheduler`.

Paper: ``/work/shared/papers/bros.txt``. The choices behind the defaults, where the paper
is silent, are listed in :mod:`sloserve.policies.bros.scheduler`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sloserve.engine.interface import PreemptionMode


@dataclass(frozen=True)
class BROSConfig:
    """Parameters of BROS (§4.2, §5)."""

    batch_base: int = 128
    """B_base: the batch size BROS starts from and backs off to."""
    batch_max: int | None = None
    """Cap on B_curr when it doubles (default R_max)."""
    adaptive_batch: bool = True
    """Double B_curr when no RT request is queued, reset on a predicted miss (§4.2)."""
    bidirectional: bool = True
    """Bidirectional KV blocks (§5); False: paged blocks and recompute (``bros-nobicache``)."""
    preemption_mode: PreemptionMode | None = None
    """How progressive dropping evicts (default: swap with bidirectional blocks, else
    recompute); swap falls back to recompute when the CPU tier is full."""
    order: Literal["fcfs", "priority", "input", "output"] = "fcfs"
    """Tie-break among BE requests with equal checkpointed blocks (after pending ones):
    arrival, priority, shortest input or shortest predicted output first."""
    watermark: float = 0.05
    """Fraction of KV blocks a newly admitted BE request must leave free (vLLM's watermark),
    so that arriving RT requests find room without dropping anyone."""
    chunked_prefill: bool = False
    """Split prompts over iterations to fit P (the paper runs prompts whole)."""
    prefill_tokens: int | None = None
    """Default P when the user sets none; None means P = C."""
    replace_guard: bool = True
    """BE replaces only RT requests that can skip this iteration and still meet their
    deadline (False: any least urgent RT request, literally as Algorithm 1)."""
    literal_rt_drops: bool = False
    """Progressive dropping evicts less urgent RT requests for any RT candidate, literally
    as §5.2. False (default): only for a running candidate or a new one that can still
    make its TTFT; a dropped RT request coming back (refill, swap-in) or a late arrival
    waits for free or BE memory instead. Dropped RT requests are soon the most urgent
    (their next-token deadline keeps running), so under memory overload the literal rule
    time-slices the KV cache among RT requests by eviction, re-prefilling them again and
    again: a livelock."""
    t_avg_alpha: float = 0.2
    """Weight of the newest iteration in the moving-average iteration time T_avg."""
    overlap_swap: bool = True
    """Iteration time = max(execution, swap) (§4.1); False: execution + swap."""

    def __post_init__(self) -> None:
        if self.batch_base < 1:
            raise ValueError("batch_base must be >= 1")
        if self.batch_max is not None and self.batch_max < self.batch_base:
            raise ValueError("batch_max must be >= batch_base")
        if self.prefill_tokens is not None and self.prefill_tokens < 1:
            raise ValueError("prefill_tokens must be >= 1")
        if not 0 < self.t_avg_alpha <= 1:
            raise ValueError("t_avg_alpha must be in (0, 1]")
        if self.preemption_mode is not None:
            object.__setattr__(self, "preemption_mode", PreemptionMode(self.preemption_mode))
        if self.order not in ("fcfs", "priority", "input", "output"):
            raise ValueError(f"order must be fcfs, priority, input or output, got {self.order!r}")
        if not 0 <= self.watermark < 1:
            raise ValueError("watermark must be in [0, 1)")
