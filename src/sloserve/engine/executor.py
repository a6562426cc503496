"""The executor seam: what one engine iteration costs, priced or run for real.

DESIGN.md's engine step is ``duration = executor.run(batch)``. The instance validates and
applies the policy's choice (evictions, swaps, KV allocation), builds an :class:`ExecBatch`
and asks its :class:`Executor` how long the iteration takes. :class:`CostModelExecutor`
(the default) prices it with the cost model, exactly as the simulator always has;
:class:`sloserve.engine.execute.TorchExecutor` runs a real forward pass and returns its
measured wall time. An executor never changes request state: the instance emits tokens
and finishes requests when the iteration ends. The one thing an executor may report back
is that a request sampled its end-of-sequence token (:meth:`Executor.take_stops`); the
instance then ends it after that token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sloserve.core.request import Request
from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.engine.interface import ScheduledRequest
from sloserve.engine.kv import KVCacheManager

_NO_STOPS: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class ExecBatch:
    """One iteration as the instance hands it to the executor, after the KV manager has
    applied it: requests' counters are still those before the iteration (a request
    processes positions ``num_computed_tokens .. num_computed_tokens + n - 1``), and the
    KV manager already holds the blocks those positions go to."""

    batch: tuple[ScheduledRequest, ...]
    """The requests and the tokens each processes."""
    stats: BatchStats
    """The aggregates the cost model prices (``swap_tokens`` included)."""
    overlap_swap: bool
    """Whether the policy overlaps KV transfers with compute."""
    kv: KVCacheManager
    """The instance's KV manager: its allocation is the cache layout."""


@runtime_checkable
class Executor(Protocol):
    """Runs (or prices) one iteration. Extension point: implement ``run``.

    ``fast_forward`` says whether the instance may advance a repeatable batch many
    iterations at once (only an executor whose durations come from the cost model can:
    a real model must run every iteration).
    """

    name: str
    fast_forward: bool

    def run(self, batch: ExecBatch) -> float:
        """Seconds the iteration takes (> 0). Must not change any request."""
        ...

    def take_stops(self) -> frozenset[int] | set[int]:
        """Requests whose last sampled token was end-of-sequence since the last call."""
        ...


class CostModelExecutor:
    """Prices an iteration with the cost model (simulate and the emulated gateway)."""

    fast_forward = True

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self.name = f"cost-model:{cost_model.name}"

    def run(self, batch: ExecBatch) -> float:
        return price(self.cost_model, batch.stats, batch.overlap_swap)

    def take_stops(self) -> frozenset[int]:
        return _NO_STOPS


def price(cm: CostModel, stats: BatchStats, overlap_swap: bool) -> float:
    """The cost model's time for one iteration: compute plus KV transfers (overlapped or
    serial, as the policy says)."""
    ex, sw = cm.batch_time(stats), cm.swap_time(stats.swap_tokens)
    return max(ex, sw) if overlap_swap else ex + sw


def eos_finished(executor: Executor, batch: Sequence[ScheduledRequest]) -> list[Request]:
    """The batch's requests whose last token was end-of-sequence (execute mode): each is
    cut to the tokens it has (``true_output_len``) so the instance finishes it now."""
    stops = executor.take_stops()
    out = []
    for r, _n in batch if stops else ():
        if r.req_id in stops and r.num_output_tokens < r.true_output_len:
            r.true_output_len = r.num_output_tokens
            out.append(r)
    return out
