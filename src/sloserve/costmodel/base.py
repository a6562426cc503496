"""Batch-time cost models: the one interface every executor and policy estimates with.

Extension point: subclass :class:`CostModel`. Implement :meth:`CostModel.batch_time`; override
:meth:`CostModel.run_times` with a vectorised form when you can, because the
simulator's fast path asks for whole runs of decode-only iterations at once.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from sloserve.core.bounds import Seconds, Time, bound_text, check_value
from sloserve.core.errors import ConfigError, UnknownNameError


@dataclass(frozen=True, slots=True)
class BatchStats:
    """The aggregates of one iteration that every paper's batch-time model needs.

    A "prefill" entry is any request processing more than its one decode token: a prompt
    (or a chunk of it) or a refill after a recompute eviction.
    """

    num_prefill_tokens: int = 0
    num_prefill_seqs: int = 0
    prefill_attn_work: int = 0
    """Σ over prefill chunks of c·(c + cached context): attention is quadratic in the chunk."""
    num_decode: int = 0
    decode_context_sum: int = 0
    """Σ over decode requests of the KV tokens each reads."""
    swap_tokens: int = 0
    """KV tokens moved between GPU and CPU in this iteration (either direction)."""

    @property
    def total_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode

    @property
    def empty(self) -> bool:
        return self.total_tokens == 0 and self.swap_tokens == 0


_new = object.__new__
_setters = tuple(
    BatchStats.__dict__[f].__set__  # the slots' own descriptors (frozen: no __setattr__)
    for f in (
        "num_prefill_tokens",
        "num_prefill_seqs",
        "prefill_attn_work",
        "num_decode",
        "decode_context_sum",
        "swap_tokens",
    )
)


def batch_stats(
    num_prefill_tokens: int,
    num_prefill_seqs: int,
    prefill_attn_work: int,
    num_decode: int,
    decode_context_sum: int,
    swap_tokens: int = 0,
) -> BatchStats:
    """``BatchStats(...)`` by position, equal in every way, at half the cost: the engine
    builds one per decision, and a frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__``."""
    s = _new(BatchStats)
    s0, s1, s2, s3, s4, s5 = _setters
    s0(s, num_prefill_tokens)
    s1(s, num_prefill_seqs)
    s2(s, prefill_attn_work)
    s3(s, num_decode)
    s4(s, decode_context_sum)
    s5(s, swap_tokens)
    return s


class CostModel(ABC):
    """Predicts how long an iteration takes on one replica, and how long KV transfers take."""

    name: str = "cost-model"

    @abstractmethod
    def batch_time(self, stats: BatchStats) -> float:
        """Seconds of GPU time for one iteration's forward pass (excluding swaps)."""

    def swap_time(self, num_tokens: int) -> float:
        """Seconds to move ``num_tokens`` tokens of KV cache over PCIe (one direction)."""
        return 0.0

    def prefill_time(self, tokens: int) -> float:
        """Seconds for one request's whole prefill of ``tokens`` tokens, alone in a batch."""
        if tokens <= 0:
            return 0.0
        return self.batch_time(
            BatchStats(
                num_prefill_tokens=tokens, num_prefill_seqs=1, prefill_attn_work=tokens * tokens
            )
        )

    def decode_time(self, batch_size: int, context_sum: int) -> float:
        """Seconds for one decode-only iteration of ``batch_size`` requests."""
        return self.batch_time(BatchStats(num_decode=batch_size, decode_context_sum=context_sum))

    def run_times(
        self, stats: BatchStats, steps: int, prefill_work_step: int = 0
    ) -> NDArray[np.float64]:
        """Durations of ``steps`` consecutive iterations of the same batch.

        From one iteration to the next, each decode request reads one more KV token (the
        decode context sum grows by ``num_decode``) and each prefill chunk sees its own
        previous chunk as cached context (the attention work grows by
        ``prefill_work_step`` = Σ c²). Override with a closed form when you can.
        """
        return np.array(
            [
                self.batch_time(
                    dataclasses.replace(
                        stats,
                        decode_context_sum=stats.decode_context_sum + i * stats.num_decode,
                        prefill_attn_work=stats.prefill_attn_work + i * prefill_work_step,
                    )
                )
                for i in range(steps)
            ],
            dtype=np.float64,
        )

    def decode_run_times(
        self, num_decode: int, context_sum: int, steps: int
    ) -> NDArray[np.float64]:
        """Durations of ``steps`` decode-only iterations of the same requests."""
        return self.run_times(
            BatchStats(num_decode=num_decode, decode_context_sum=context_sum), steps
        )


class ConstantCostModel(CostModel):
    """Every non-empty iteration takes the same time; swaps cost a fixed time per token.

    For tests and hand-checkable examples, not for conclusions.
    """

    def __init__(self, iteration_s: float = 0.01, swap_s_per_token: float = 0.0) -> None:
        iteration_s = check_value(Seconds, iteration_s, "constant cost model: iteration_s")
        swap_s_per_token = check_value(Time, swap_s_per_token, "constant cost model: swap_s")
        self.iteration_s = iteration_s
        self.swap_s_per_token = swap_s_per_token
        self.name = f"constant:{iteration_s}"

    def batch_time(self, stats: BatchStats) -> float:
        return self.iteration_s if stats.total_tokens > 0 else 0.0

    def swap_time(self, num_tokens: int) -> float:
        return num_tokens * self.swap_s_per_token

    def run_times(
        self, stats: BatchStats, steps: int, prefill_work_step: int = 0
    ) -> NDArray[np.float64]:
        return np.full(steps, self.batch_time(stats))


COST_MODEL_SPECS = ("constant:SECONDS",)
"""The ``cost_model`` strings a config accepts (unset: the profile's own model)."""


def parse_cost_model(spec: str) -> CostModel:
    """``constant:SECONDS`` as a cost model; SECONDS within :data:`~sloserve.core.bounds.Seconds`.

    Raises :class:`~sloserve.core.errors.ConfigError` naming the spec and the valid forms.
    """
    kind, sep, arg = spec.partition(":")
    if kind != "constant" or not sep:
        raise UnknownNameError(
            f"unknown cost model {spec!r}; valid: {', '.join(COST_MODEL_SPECS)} "
            "(or unset for the profile's)"
        )
    try:
        seconds = float(arg)
    except ValueError:
        raise ConfigError(
            f"cost model {spec!r}: SECONDS must be a number {bound_text(Seconds)}"
        ) from None
    return ConstantCostModel(check_value(Seconds, seconds, f"cost model {spec!r}"))
