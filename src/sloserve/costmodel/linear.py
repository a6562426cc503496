"""The linear (piecewise-linear in the non-attention term) batch-time model.

This is the InferMax/Vidur decomposition: non-attention operators scale with the tokens in
the batch, decode attention with the KV tokens read, prefill attention with Σ c·(c+ctx).
Small batches are bound by reading the weights, not by FLOPs, so the non-attention term has
a floor: ``max(token_floor, token_intercept + per_token·T)``. All coefficients are per
iteration (already summed over layers) and in seconds. BROS's α0·Ln + α1·Ln·La + β and
Aladdin's prefill/decode forms are special cases (zero the terms they lack).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.costmodel.run_kernels import decode_run, mixed_run


class LinearCoefficients(BaseModel):
    """Per-iteration coefficients (seconds, per token / per sequence / per unit of work)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    intercept: float = Field(default=0.0, ge=0, description="fixed cost of any iteration")
    token_floor: float = Field(default=0.0, ge=0, description="non-attention time floor")
    token_intercept: float = Field(default=0.0, description="non-attention line intercept")
    per_token: float = Field(default=0.0, ge=0, description="non-attention time per token")
    decode_intercept: float = Field(default=0.0, ge=0, description="once if any decode")
    per_decode_seq: float = Field(default=0.0, ge=0)
    per_decode_kv: float = Field(default=0.0, ge=0, description="per KV token read in decode")
    prefill_intercept: float = Field(default=0.0, ge=0, description="once if any prefill")
    per_prefill_seq: float = Field(default=0.0, ge=0)
    per_prefill_work: float = Field(default=0.0, ge=0, description="per unit of Σ c·(c+ctx)")
    comm_intercept: float = Field(default=0.0, ge=0, description="tensor-parallel all-reduces")
    comm_per_token: float = Field(default=0.0, ge=0)


class LinearCostModel(CostModel):
    """Evaluates :class:`LinearCoefficients`; swaps cost ``tokens·kv_bytes / bandwidth``."""

    def __init__(
        self,
        coefficients: LinearCoefficients,
        *,
        kv_bytes_per_token: int = 0,
        swap_bytes_per_s: float = 25e9,
        swap_latency_s: float = 0.0,
        name: str = "linear",
    ) -> None:
        self.c = coefficients
        self.kv_bytes_per_token = kv_bytes_per_token
        self.swap_bytes_per_s = swap_bytes_per_s
        self.swap_latency_s = swap_latency_s
        self.name = name
        self._run_consts: dict[tuple[int, int, int], tuple[float, float, float]] = {}
        """:meth:`run_until`'s constants per batch shape, for the coefficients in
        ``_run_consts_of`` (``c`` may be replaced: then they are computed again)."""
        self._run_consts_of: LinearCoefficients | None = None

    def _non_attention(self, tokens: int) -> float:
        c = self.c
        return max(c.token_floor, c.token_intercept + c.per_token * tokens)

    def _time(self, stats: BatchStats, ctx: Any, work: Any) -> Any:
        """The model for ``stats`` with the decode context sum and prefill work given
        separately (floats or arrays): one expression, so that a run priced at once is
        bit-identical to the same iterations priced one by one."""
        c = self.c
        tokens = stats.num_prefill_tokens + stats.num_decode
        t = c.intercept + self._non_attention(tokens) + c.comm_intercept + c.comm_per_token * tokens
        if stats.num_decode:
            t = t + (
                c.decode_intercept + c.per_decode_seq * stats.num_decode + c.per_decode_kv * ctx
            )
        if stats.num_prefill_tokens:
            t = t + (
                c.prefill_intercept
                + c.per_prefill_seq * stats.num_prefill_seqs
                + c.per_prefill_work * work
            )
        return t

    def _shape_consts(self, nd: int, npf: int, nps: int) -> tuple[float, float, float]:
        """The terms of :meth:`_time` that depend only on the batch's shape (decodes,
        prefill tokens, prefill sequences), each computed as ``_time`` computes it: the
        base, the decode and the prefill intercepts. Kept for decode-only shapes, the fast
        path's usual batch (at most R_max of them; a prompt's length varies too much to be
        worth keeping), and recomputed when ``c`` is replaced (the coefficients are
        frozen): the very same floats, once."""
        c = self.c
        consts = self._run_consts
        if self._run_consts_of is not c:
            consts = self._run_consts = {}
            self._run_consts_of = c
        shape = (nd, npf, nps)
        got = consts.get(shape)
        if got is None:
            tokens = npf + nd
            got = (
                c.intercept
                + self._non_attention(tokens)
                + c.comm_intercept
                + c.comm_per_token * tokens,
                c.decode_intercept + c.per_decode_seq * nd,
                c.prefill_intercept + c.per_prefill_seq * nps,
            )
            if not npf and len(consts) < 1024:
                consts[shape] = got
        return got

    def batch_time(self, stats: BatchStats) -> float:
        nd = stats.num_decode
        npf = stats.num_prefill_tokens
        if npf + nd == 0:
            return 0.0
        # _time's expression, its shape terms from _shape_consts (the same floats).
        base, dec, pre = self._shape_consts(nd, npf, stats.num_prefill_seqs)
        t = base
        if nd:
            t = t + (dec + self.c.per_decode_kv * float(stats.decode_context_sum))
        if npf:
            t = t + (pre + self.c.per_prefill_work * float(stats.prefill_attn_work))
        return t

    def run_times(
        self, stats: BatchStats, steps: int, prefill_work_step: int = 0
    ) -> NDArray[np.float64]:
        if stats.num_prefill_tokens + stats.num_decode == 0:
            return np.zeros(steps)
        # Only the attention terms change between steps, each linearly; a term the batch
        # does not have (no decodes, no prefill) is not evaluated by _time at all.
        j = np.arange(steps, dtype=np.int64)
        ctx: Any = 0.0
        work: Any = 0.0
        if stats.num_decode:
            ctx = (stats.decode_context_sum + j * stats.num_decode).astype(np.float64)
        if stats.num_prefill_tokens:
            work = (stats.prefill_attn_work + j * prefill_work_step).astype(np.float64)
        t = self._time(stats, ctx, work)
        if not isinstance(t, np.ndarray):  # (not reached: a run has decodes or a prefill)
            return np.full(steps, t, dtype=np.float64)
        return np.asarray(t, dtype=np.float64)

    def run_until(
        self, stats: BatchStats, now: float, t_next: float, limit: int, prefill_work_step: int = 0
    ) -> tuple[list[float], list[float]]:
        """Durations and end times of at most ``limit`` iterations of the same batch from
        ``now``, priced one at a time and stopping at the first that ends at or after
        ``t_next``: the fast path's usual case (the next event is a few iterations away),
        where building arrays for :meth:`run_times` costs more than the few steps it needs.

        Bit-identical to :meth:`run_times` and to the sums of :func:`numpy.cumsum`: the same
        floating-point operations in the same order, one float at a time (the loops are
        :mod:`~sloserve.costmodel.run_kernels`', which the compiled build compiles)."""
        nd = stats.num_decode
        npf = stats.num_prefill_tokens
        if npf + nd == 0:
            return [0.0] * limit, [now] * limit
        c = self.c
        base, dec, pre = self._shape_consts(nd, npf, stats.num_prefill_seqs)
        if not npf:  # decodes only (most runs): the loop without its per-step tests
            return decode_run(
                base, dec, c.per_decode_kv, stats.decode_context_sum, nd, now, t_next, limit
            )
        return mixed_run(
            base,
            dec,
            c.per_decode_kv,
            stats.decode_context_sum,
            nd,
            pre,
            c.per_prefill_work,
            stats.prefill_attn_work,
            prefill_work_step,
            now,
            t_next,
            limit,
        )

    def swap_time(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        return self.swap_latency_s + num_tokens * self.kv_bytes_per_token / self.swap_bytes_per_s
