"""Fit :class:`LinearCoefficients` to Vidur's measured GPU operator timings.

The data are the Vidur project's public profiling tables (microsoft/vidur, MIT licence), kept
outside the repository in ``shared/vidur-profiling``; ``scripts/fit_vidur_profiles.py`` runs
:func:`fit_builtin_profiles` and writes the two built-in profiles:

* ``llama-2-70b-a100x2``: Llama-2-70B, TP2 on two A100-80GB. Linear operators, attention
  and all-reduce are all measured in that setting.
* ``llama-2-7b-a100``: Llama-2-7B on one A100-80GB. Linear operators are measured; **the
  attention terms are derived from the 70B TP2 attention measurements** (no 7B attention
  table is public), see *Attention of the 7B profile* below.

Operator groups and the choices made for each
---------------------------------------------
Every fit is a weighted least-squares fit of *relative* error (each row of the design
matrix and the target are divided by the measured time), because the times span three
orders of magnitude and the simulator needs the small decode batches as much as the large
prefill chunks. Coefficients whose physical meaning requires it are constrained to be
non-negative (a negative one is dropped and the rest refitted). Every group is fitted on
the measured points with index ``i % 5 != 4`` (rows sorted by their inputs) and its error is
reported on the held-out fifth (``i % 5 == 4``); the committed coefficients are the ones
fitted on the 80%, so the reported errors describe exactly them.

Non-attention (``token_floor``, ``token_intercept``, ``per_token``)
    ``mlp.csv`` rows with ``num_tensor_parallel_workers == tp``; the time of one iteration is
    ``num_layers × Σ per-layer operator medians + emb``. Per layer: ``input_layernorm``,
    ``attn_pre_proj`` (QKV), ``attn_rope``, ``attn_post_proj`` (O), ``post_attention_layernorm``,
    ``mlp_up_proj`` (gate+up), ``mlp_act``, ``mlp_down_proj``, ``add`` (Vidur profiles one
    residual add per layer and counts it once; so do we). Once per iteration: ``emb`` (the
    token embedding; Vidur's simulator leaves it out, we keep it since it is measured). Not
    in these files and therefore **not modelled**: the LM head and sampling (Vidur does not
    count them either; the LM head reads ``hidden × vocab / tp`` weights, about 0.15 ms per
    iteration on A100 at decode batch sizes, under 2% of a step), the KV-cache write
    (``reshape_and_cache``; small) and CPU-side overhead (scheduling, input preparation;
    Vidur models it separately and leaves it off by default), hence ``intercept = 0``.
    The curve is flat while weight reads dominate (small batches) and then linear in the
    tokens, with GEMM tile-quantisation steps in between. We fit
    ``max(floor, intercept + slope·T)`` by trying every split of the sorted token counts into
    a flat part (a relative-least-squares constant) and a linear part (a relative-least-
    squares line) and keeping the split whose max-form has the least relative squared error.

Decode attention (``decode_intercept``, ``per_decode_seq``, ``per_decode_kv``)
    Attention rows with ``is_prefill == False``: ``attn_decode + attn_input_reshape +
    attn_output_reshape`` per layer, fitted as ``a + b·batch + c·batch·kv`` (all requests in a
    profiled batch have the same KV length, so ``batch·kv`` is Σ decode context), times the
    number of layers.

Prefill attention (``prefill_intercept``, ``per_prefill_work``; ``per_prefill_seq = 0``)
    Rows with ``is_prefill == True`` (batch 1): ``attn_prefill + reshapes`` per layer fitted as
    ``a + w·c·(c + kv)``. The profile has one sequence per kernel, so a per-batch intercept
    and a per-sequence term cannot be told apart; vLLM runs all prefill chunks of a batch in
    one variable-length FlashAttention kernel, so we put ``a`` in ``prefill_intercept``.

Tensor-parallel all-reduce (``comm_intercept``, ``comm_per_token``)
    Megatron-style TP does two all-reduces of ``T × hidden × dtype`` bytes per layer plus one
    for the vocabulary-parallel embedding: ``2·L + 1`` per iteration. We use
    ``network/a100_pairwise_nvlink/all_reduce.csv`` with ``num_workers == 2`` (two A100s joined
    by NVLink; the ``a100_dgx`` two-worker rows are much slower, consistent with a cross-node
    link, and do not describe a 2-GPU replica). The measured curve is flat (~0.06 ms, latency
    bound) up to a few MB and then linear; the model's comm term is linear. To weight the
    sizes the way the simulator uses them we evaluate the measured curve (a rolling median
    over 5 neighbouring sizes, linearly interpolated) at the message size of every token
    count in the compute grid and fit ``a + b·bytes`` to those points. The line under-predicts
    the latency floor at decode sizes by up to ~25% and is within a few % for prefill sizes;
    both are in the fit report.

Attention of the 7B profile
    No Llama-2-7B attention table is public, so the 7B attention is derived from the 70B
    TP2 fit, per layer, then multiplied by the 7B's 32 layers. Decode attention is bound by
    reading the KV cache, so its KV term is scaled by the ratio of KV bytes per token per
    layer per GPU: 7B TP1 ``2·32·128·2 = 16384`` over 70B TP2 ``2·8·128·2 / 2 = 2048``, i.e.
    ×8 (over all layers: 524288 vs 163840 bytes per GPU per token). The decode intercept and
    per-sequence term (launch, query load, output write) depend on the query heads per GPU,
    32 in both settings, and are kept. Prefill attention is compute bound; its FLOPs per
    unit of ``c·(c+kv)`` are proportional to query heads × head dim per GPU, again 32 × 128 in
    both, so by default (``attention_scaling="flops"``) the prefill terms are not scaled.
    ``attention_scaling="kv-bytes"`` scales every attention term by the KV-bytes ratio
    instead (an upper bound: it makes 7B prefill attention 8× the measured 70B-per-GPU
    kernel, i.e. far slower than the A100's FLOPs allow).

Measured-iteration CSVs (your own hardware)
-------------------------------------------
:func:`fit_profile_csv` fits the same decomposition to whole measured iterations, e.g. the
output of :func:`sloserve.costmodel.profiler.profile_model` (``sloserve profile``). The
format, one row per measured batch (a header line, then data lines; blank lines are skipped
but counted, so errors name the right line):

Required columns (the :class:`~sloserve.costmodel.base.BatchStats` aggregates, exactly as
the simulator computes them, and the measured time)
    ``num_prefill_tokens`` (Σ prefill chunk lengths c), ``num_prefill_seqs`` (chunks),
    ``prefill_attn_work`` (Σ c·(c + ctx), ctx = tokens already cached for that sequence),
    ``num_decode`` (decode requests), ``decode_context_sum`` (Σ ctx over decode requests,
    the KV tokens cached before the step, as ``engine.instance`` counts it) and ``time_s``
    (seconds of one iteration; a median over repeats is the intended value). Counts are
    integers ≥ 0, ``time_s`` > 0; a row must have tokens; ``num_prefill_seqs`` ≥ 1 and
    ≤ ``num_prefill_tokens`` and ``prefill_attn_work`` ≥ ``num_prefill_tokens`` exactly when
    there is prefill; ``decode_context_sum`` is 0 when ``num_decode`` is.
Optional per-group times (seconds; empty cell = not measured)
    ``time_decode_attention_s`` and ``time_prefill_attention_s`` (the attention kernels and
    KV-cache writes of the decode / prefill part of the batch), ``time_comm_s``
    (tensor-parallel all-reduces) and ``time_non_attention_s`` (informational, see below).
    Each is ≥ 0 and ≤ ``time_s``; an attention cell is required (> 0) on every row of its
    kind once the column exists, and empty or 0 on rows without that kind.
Metadata columns (strings or numbers, constant over the file)
    ``device``, ``model``, ``dtype``, ``tp``, ``device_memory_gib`` and ``model_<field>`` for
    every :class:`~sloserve.core.hardware.ModelSpec` field (``model_num_layers``, …). With
    them :func:`profile_from_csv` builds a profile without being told the model and GPU.
    A file mixing two ``model`` or ``device`` values is an error. Other columns are ignored
    and listed in the report (``ignored_columns``), so a typo in a group column shows.

Every problem raises :class:`~sloserve.core.errors.ConfigError` naming file, line and column.
Rows with identical aggregates are merged (median of every time) before fitting, so the
hold-out never tests a batch that was also trained on. Then, as for Vidur's tables, points
are sorted by their aggregates and every 5th is held out (the same rows for every group).

*Per-group mode* (each kind of row present has its attention column): decode attention is
``decode_intercept + per_decode_seq·num_decode + per_decode_kv·decode_context_sum`` fitted
to ``time_decode_attention_s``; prefill attention ``prefill_intercept + per_prefill_seq·seqs
+ per_prefill_work·prefill_attn_work`` fitted to ``time_prefill_attention_s``; the comm term
``comm_intercept + comm_per_token·T`` to the positive ``time_comm_s`` cells (else 0); the
non-attention floor+line to the **remainder** ``time_s − Σ(attention, comm)`` over ``T``.
Fitting the remainder rather than ``time_non_attention_s`` makes the terms add up to the
measured total: whatever no group measured (LM head, embedding, launch and Python overhead)
belongs to the per-iteration cost, which is where the simulator needs it. ``intercept`` is 0
(absorbed by the floor). Each group's report has its held-out R² and relative errors.

*Total mode* (no usable group columns): one joint relative-least-squares fit of every term to
``time_s``. The max() is handled as in :func:`fit_floor_line`: every split of the distinct
token counts into a flat prefix (one ``token_floor`` column) and a linear suffix
(``token_intercept`` and ``per_token`` columns) is tried and the split whose max-form has the
least relative squared error is kept. The comm terms are not identifiable from totals
(they are linear in T like the non-attention line) and stay 0, folded into ``per_token``.

In both modes a term whose column is (numerically) a combination of higher-priority ones is
dropped (fixed at 0) and listed under ``dropped`` in the report: a profile with one sequence
per prefill chunk cannot tell ``per_prefill_seq`` from ``prefill_intercept`` (we keep the
intercept, as above), decode-only data cannot tell ``decode_intercept`` from the floor. The
priority is: the non-attention terms, the KV and work terms, the intercepts, the per-sequence
terms. Only ``token_intercept`` may be negative.

BROS and Aladdin as special cases
---------------------------------
BROS prices a batch as ``α0·Ln + α1·Ln·La + β``, one fit for prefill requests and one for
decode requests, summed. ``Ln·La`` is the size of the attention score matrix; a batch's
attention is block-diagonal, so we read it per request, ``Σ_i Ln_i·La_i`` (identical to the
paper's product for one request): for decode requests ``Σ 1·ctx = decode_context_sum``, for
prefill requests ``Σ c·(c + ctx) = prefill_attn_work`` (``c²`` without cache, the paper's
``La = Ln``). :func:`bros_coefficients` maps ``β_p → prefill_intercept``,
``β_d → decode_intercept``, ``α1_p → per_prefill_work``, ``α1_d → per_decode_kv``,
``α0_p → per_token`` and ``α0_d − α0_p → per_decode_seq`` (floor, intercepts of the
non-attention line and comm terms 0). Aladdin models prefill-only batches as ``k1·Σl + c1``
and decode-only batches as ``(k2·l̄ + c2)·b + c3 = k2·Σctx + c2·b + c3``;
:func:`aladdin_coefficients` maps ``k1 → per_token``, ``c1 → prefill_intercept``,
``k2 → per_decode_kv``, ``c2 − k1 → per_decode_seq``, ``c3 → decode_intercept`` (a hybrid
batch then costs the sum of both, as in BROS). Both are exact on every batch their own
formulas price, **provided the decode per-request slope is at least the prefill per-token
slope** (``α0_d ≥ α0_p``, ``c2 ≥ k1``): :class:`LinearCoefficients` has one per-token term
shared by prefill and decode tokens and no per-prefill-token term, so the converters raise
:class:`~sloserve.core.errors.ConfigError` otherwise rather than return a model that is not
the paper's. BROS's ``Mcpu`` (checkpointed blocks) is a transfer, priced by ``swap_time``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml
from numpy.typing import NDArray
from pydantic import ValidationError

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel.base import BatchStats
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel
from sloserve.costmodel.profile import ReplicaProfile, load_profile

FloatArray = NDArray[np.float64]
AttentionScaling = Literal["flops", "kv-bytes"]

MS = 1e-3
"""Seconds per millisecond (Vidur's tables are in ms; coefficients are in s)."""

HOLDOUT_EVERY = 5
"""Every 5th point (index % 5 == 4 in input order) is held out for the error report."""

PER_LAYER_OPS: tuple[str, ...] = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
"""``mlp.csv`` operators that run once per transformer layer."""

PER_ITERATION_OPS: tuple[str, ...] = ("emb",)
"""``mlp.csv`` operators that run once per forward pass (the token embedding)."""

ATTENTION_DECODE_OPS: tuple[str, ...] = ("attn_decode", "attn_input_reshape", "attn_output_reshape")
ATTENTION_PREFILL_OPS: tuple[str, ...] = (
    "attn_prefill",
    "attn_input_reshape",
    "attn_output_reshape",
)

MLP_CSV = "compute/a100/meta-llama/{model}/mlp.csv"
ATTENTION_70B_TP2_CSV = "compute/a100/meta-llama/Llama-2-70b-hf/attention_tp2_2024-05.csv"
ALL_REDUCE_CSV = "network/a100_pairwise_nvlink/all_reduce.csv"

INTERCEPT_S = 0.0
"""Per-iteration CPU/scheduling overhead: not in the GPU operator data; left at 0."""

ACTIVATION_RESERVE_GIB = 1.0
"""Per-GPU memory kept for activations (the :class:`ReplicaProfile` default)."""

LLAMA_2_7B = ModelSpec(
    name="meta-llama/Llama-2-7b-hf",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=32,
    intermediate_size=11008,
    vocab_size=32000,
    params_b=6.74,
    dtype_bytes=2,
    max_context=4096,
)
LLAMA_2_70B = ModelSpec(
    name="meta-llama/Llama-2-70b-hf",
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    intermediate_size=28672,
    vocab_size=32000,
    params_b=68.98,
    dtype_bytes=2,
    max_context=4096,
)
A100_80GB = GPUSpec(
    name="A100-80GB",
    memory_gib=80,
    pcie_gb_per_s=25.0,
    bf16_tflops=312,
    hbm_tb_per_s=2.039,
)


# --------------------------------------------------------------------------- error reports


@dataclass(frozen=True)
class FitError:
    """Prediction error of one operator group on its held-out points."""

    r2: float
    median_rel_err: float
    p90_rel_err: float
    max_rel_err: float
    n_train: int
    n_test: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "r2": _round(self.r2, 4),
            "median_rel_err": _round(self.median_rel_err, 4),
            "p90_rel_err": _round(self.p90_rel_err, 4),
            "max_rel_err": _round(self.max_rel_err, 4),
            "n_train": self.n_train,
            "n_test": self.n_test,
        }


def error_report(predicted: FloatArray, measured: FloatArray, n_train: int) -> FitError:
    """R² and relative-error quantiles of ``predicted`` against ``measured``."""
    pred = np.asarray(predicted, dtype=np.float64)
    meas = np.asarray(measured, dtype=np.float64)
    if pred.shape != meas.shape or meas.size == 0:
        raise ValueError("predicted and measured must be non-empty and of the same shape")
    rel = np.abs(pred - meas) / meas
    ss_res = float(np.sum((pred - meas) ** 2))
    ss_tot = float(np.sum((meas - meas.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    return FitError(
        r2=r2,
        median_rel_err=float(np.median(rel)),
        p90_rel_err=float(np.quantile(rel, 0.9)),
        max_rel_err=float(rel.max()),
        n_train=n_train,
        n_test=int(meas.size),
    )


def holdout_mask(n: int, every: int = HOLDOUT_EVERY) -> NDArray[np.bool_]:
    """True for held-out points: every ``every``-th one (index % every == every - 1)."""
    mask: NDArray[np.bool_] = np.arange(n) % every == every - 1
    return mask


# --------------------------------------------------------------------------- least squares


def relative_lstsq(
    x: FloatArray, y: FloatArray, nonneg: Sequence[bool] | None = None
) -> FloatArray:
    """Coefficients ``c`` minimising ``Σ ((x·c − y) / y)²``.

    ``nonneg[j]`` constrains ``c[j] ≥ 0``: while a constrained coefficient comes out
    negative, the most negative one is fixed at 0 and the others are refitted.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError("x must be (n, k) and y (n,)")
    if np.any(y <= 0):
        raise ValueError("relative least squares needs positive targets")
    k = x.shape[1]
    cons = [False] * k if nonneg is None else list(nonneg)
    w = 1.0 / y
    active = list(range(k))
    coef = np.zeros(k)
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        coef = np.zeros(k)
        coef[active] = sol
        bad = [j for j in active if cons[j] and coef[j] < 0]
        if not bad:
            return coef
        active.remove(min(bad, key=lambda j: coef[j]))
    return coef


@dataclass(frozen=True)
class FloorLine:
    """``max(floor, intercept + slope·x)``, the shape of the non-attention curve."""

    floor: float
    intercept: float
    slope: float

    def __call__(self, x: FloatArray) -> FloatArray:
        xs = np.asarray(x, dtype=np.float64)
        return np.maximum(self.floor, self.intercept + self.slope * xs)

    @property
    def knee(self) -> float:
        """Where the line crosses the floor (0 when there is no floor)."""
        if self.slope <= 0 or self.floor <= self.intercept:
            return 0.0
        return (self.floor - self.intercept) / self.slope


def fit_floor_line(x: FloatArray, y: FloatArray) -> FloorLine:
    """Relative-least-squares fit of ``max(floor, intercept + slope·x)``.

    Every split of the points (sorted by ``x``) into a flat prefix and a linear suffix is
    tried: the prefix gets the constant, the suffix the line, each by relative least squares;
    the split whose max-form has the smallest relative squared error over all points wins.
    """
    order = np.argsort(x, kind="stable")
    xs = np.asarray(x, dtype=np.float64)[order]
    ys = np.asarray(y, dtype=np.float64)[order]
    n = xs.size
    if n < 3:
        raise ValueError("need at least 3 points to fit a floor and a line")
    best: FloorLine | None = None
    best_loss = np.inf
    for split in range(0, n - 1):
        if split:
            inv = 1.0 / ys[:split]
            floor = float(inv.sum() / np.sum(inv**2))
        else:
            floor = 0.0
        hi_x, hi_y = xs[split:], ys[split:]
        if np.ptp(hi_x) == 0:
            continue
        line = relative_lstsq(np.column_stack([np.ones_like(hi_x), hi_x]), hi_y, [False, True])
        cand = FloorLine(floor=floor, intercept=float(line[0]), slope=float(line[1]))
        loss = float(np.sum(((cand(xs) - ys) / ys) ** 2))
        if loss < best_loss:
            best, best_loss = cand, loss
    assert best is not None
    return best


# --------------------------------------------------------------------------- data loading


def _median_col(op: str) -> str:
    return f"time_stats.{op}.median"


def load_mlp_table(path: str | Path, tp: int, num_layers: int) -> pd.DataFrame:
    """Per-iteration non-attention time (ms) vs ``num_tokens`` from a Vidur ``mlp.csv``.

    Columns: ``num_tokens``, ``layer_ms`` (Σ per-layer operator medians), ``emb_ms``,
    ``iteration_ms`` (``num_layers·layer_ms + emb_ms``); duplicate token counts are merged by
    their median. Raises if the file has an operator we do not classify.
    """
    df = pd.read_csv(path)
    ops = {c.split(".")[1] for c in df.columns if c.startswith("time_stats.")}
    unknown = ops - set(PER_LAYER_OPS) - set(PER_ITERATION_OPS)
    if unknown:
        raise ValueError(f"{path}: unclassified operators {sorted(unknown)}")
    rows = df[df["num_tensor_parallel_workers"] == tp]
    if rows.empty:
        raise ValueError(f"{path}: no rows with num_tensor_parallel_workers == {tp}")
    out = pd.DataFrame(
        {
            "num_tokens": rows["num_tokens"].astype(np.int64),
            "layer_ms": rows[[_median_col(o) for o in PER_LAYER_OPS]].sum(axis=1),
            "emb_ms": rows[[_median_col(o) for o in PER_ITERATION_OPS]].sum(axis=1),
        }
    )
    out = out.groupby("num_tokens", as_index=False).median().sort_values("num_tokens")
    out["iteration_ms"] = num_layers * out["layer_ms"] + out["emb_ms"]
    return out.reset_index(drop=True)


def load_attention_tables(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(decode, prefill) per-layer attention times (ms) from a Vidur attention CSV.

    Decode columns: ``batch_size``, ``kv_cache_size``, ``time_ms``; prefill columns:
    ``prefill_chunk_size``, ``kv_cache_size``, ``time_ms``; duplicates merged by median.
    """
    df = pd.read_csv(path)
    is_prefill = df["is_prefill"].astype(bool)
    dec = df[~is_prefill]
    pre = df[is_prefill]
    decode = pd.DataFrame(
        {
            "batch_size": dec["batch_size"].astype(np.int64),
            "kv_cache_size": dec["kv_cache_size"].astype(np.int64),
            "time_ms": dec[[_median_col(o) for o in ATTENTION_DECODE_OPS]].sum(axis=1),
        }
    )
    prefill = pd.DataFrame(
        {
            "prefill_chunk_size": pre["prefill_chunk_size"].astype(np.int64),
            "kv_cache_size": pre["kv_cache_size"].astype(np.int64),
            "time_ms": pre[[_median_col(o) for o in ATTENTION_PREFILL_OPS]].sum(axis=1),
        }
    )
    decode = (
        decode.groupby(["batch_size", "kv_cache_size"], as_index=False)
        .median()
        .sort_values(["batch_size", "kv_cache_size"])
        .reset_index(drop=True)
    )
    prefill = (
        prefill.groupby(["prefill_chunk_size", "kv_cache_size"], as_index=False)
        .median()
        .sort_values(["prefill_chunk_size", "kv_cache_size"])
        .reset_index(drop=True)
    )
    return decode, prefill


def load_all_reduce(path: str | Path, num_workers: int) -> pd.DataFrame:
    """All-reduce median time (ms) vs message ``size`` (bytes) for ``num_workers`` GPUs."""
    df = pd.read_csv(path)
    rows = df[df["num_workers"] == num_workers]
    if rows.empty:
        raise ValueError(f"{path}: no rows with num_workers == {num_workers}")
    out = pd.DataFrame(
        {"size": rows["size"].astype(np.int64), "time_ms": rows[_median_col("all_reduce")]}
    )
    return out.groupby("size", as_index=False).median().sort_values("size").reset_index(drop=True)


# --------------------------------------------------------------------------- group fits


@dataclass(frozen=True)
class NonAttentionFit:
    """Per-iteration non-attention time (ms): ``max(floor, intercept + per_token·T)``."""

    curve: FloorLine
    error: FitError


@dataclass(frozen=True)
class DecodeAttentionFit:
    """Per-layer decode attention (ms): ``intercept + per_seq·batch + per_kv·Σ ctx``."""

    intercept_ms: float
    per_seq_ms: float
    per_kv_ms: float
    error: FitError

    def predict(self, batch: FloatArray, kv: FloatArray) -> FloatArray:
        b = np.asarray(batch, dtype=np.float64)
        return self.intercept_ms + self.per_seq_ms * b + self.per_kv_ms * b * np.asarray(kv)


@dataclass(frozen=True)
class PrefillAttentionFit:
    """Per-layer prefill attention (ms): ``intercept + per_work·c·(c + kv)``."""

    intercept_ms: float
    per_work_ms: float
    error: FitError

    def predict(self, chunk: FloatArray, kv: FloatArray) -> FloatArray:
        c = np.asarray(chunk, dtype=np.float64)
        return self.intercept_ms + self.per_work_ms * c * (c + np.asarray(kv))


@dataclass(frozen=True)
class AllReduceFit:
    """One all-reduce (ms): ``intercept + per_byte·bytes``."""

    intercept_ms: float
    per_byte_ms: float
    error: FitError
    raw_error: FitError
    """Error against every raw measured size in the fitted range (not only held-out)."""
    decode_size_error: FitError
    """Error against the raw measured sizes of decode batches (1-256 tokens)."""

    def predict(self, size: FloatArray) -> FloatArray:
        return self.intercept_ms + self.per_byte_ms * np.asarray(size, dtype=np.float64)


def fit_non_attention(table: pd.DataFrame) -> NonAttentionFit:
    """Fit the floor+line to ``table`` from :func:`load_mlp_table` (per-iteration ms)."""
    x = table["num_tokens"].to_numpy(dtype=np.float64)
    y = table["iteration_ms"].to_numpy(dtype=np.float64)
    test = holdout_mask(x.size)
    curve = fit_floor_line(x[~test], y[~test])
    return NonAttentionFit(
        curve=curve, error=error_report(curve(x[test]), y[test], int((~test).sum()))
    )


def fit_decode_attention(decode: pd.DataFrame) -> DecodeAttentionFit:
    """Fit ``a + b·batch + c·batch·kv`` (per layer, ms) to the decode attention rows."""
    b = decode["batch_size"].to_numpy(dtype=np.float64)
    kv = decode["kv_cache_size"].to_numpy(dtype=np.float64)
    y = decode["time_ms"].to_numpy(dtype=np.float64)
    x = np.column_stack([np.ones_like(b), b, b * kv])
    test = holdout_mask(y.size)
    coef = relative_lstsq(x[~test], y[~test], [True, True, True])
    err = error_report(x[test] @ coef, y[test], int((~test).sum()))
    return DecodeAttentionFit(float(coef[0]), float(coef[1]), float(coef[2]), err)


def fit_prefill_attention(prefill: pd.DataFrame) -> PrefillAttentionFit:
    """Fit ``a + w·c·(c + kv)`` (per layer, ms) to the prefill attention rows."""
    c = prefill["prefill_chunk_size"].to_numpy(dtype=np.float64)
    kv = prefill["kv_cache_size"].to_numpy(dtype=np.float64)
    y = prefill["time_ms"].to_numpy(dtype=np.float64)
    x = np.column_stack([np.ones_like(c), c * (c + kv)])
    test = holdout_mask(y.size)
    coef = relative_lstsq(x[~test], y[~test], [True, True])
    err = error_report(x[test] @ coef, y[test], int((~test).sum()))
    return PrefillAttentionFit(float(coef[0]), float(coef[1]), err)


def fit_all_reduce(
    measured: pd.DataFrame, token_grid: Sequence[int], bytes_per_token: int
) -> AllReduceFit:
    """Fit ``a + b·bytes`` to the all-reduce curve at the message sizes of ``token_grid``.

    The measured medians are smoothed (rolling median over 5 neighbouring sizes) and
    linearly interpolated at ``T·bytes_per_token`` for every ``T`` in ``token_grid``, so the
    fit weights message sizes as the simulator's batches produce them.
    """
    size = measured["size"].to_numpy(dtype=np.float64)
    raw = measured["time_ms"].to_numpy(dtype=np.float64)
    smooth = (
        measured["time_ms"].rolling(5, center=True, min_periods=1).median().to_numpy(np.float64)
    )
    tokens = np.asarray(sorted(set(token_grid)), dtype=np.float64)
    at = tokens * bytes_per_token
    if at.max() > size.max():
        raise ValueError("all-reduce data do not cover the largest message size")
    y = np.interp(at, size, smooth)
    x = np.column_stack([np.ones_like(at), at])
    test = holdout_mask(y.size)
    coef = relative_lstsq(x[~test], y[~test], [True, True])
    n_train = int((~test).sum())
    err = error_report(x[test] @ coef, y[test], n_train)
    in_range = (size >= at.min()) & (size <= at.max())
    raw_err = error_report(coef[0] + coef[1] * size[in_range], raw[in_range], n_train)
    dec = (size >= bytes_per_token) & (size <= 256 * bytes_per_token)
    dec_err = error_report(coef[0] + coef[1] * size[dec], raw[dec], n_train)
    return AllReduceFit(float(coef[0]), float(coef[1]), err, raw_err, dec_err)


# --------------------------------------------------------------------------- profiles


def kv_bytes_per_token_per_layer_per_gpu(model: ModelSpec, tp: int) -> float:
    """K and V bytes of one token in one layer on one GPU (KV heads split over TP)."""
    return model.kv_bytes_per_token / model.num_layers / tp


def query_width_per_gpu(model: ModelSpec, tp: int) -> float:
    """Query heads × head dim on one GPU: attention FLOPs per unit of ``c·(c+kv)``."""
    return model.num_heads * model.head_dim / tp


@dataclass(frozen=True)
class AttentionPerLayer:
    """Per-layer attention coefficients (ms) used to build a profile."""

    decode_intercept_ms: float
    decode_per_seq_ms: float
    decode_per_kv_ms: float
    prefill_intercept_ms: float
    prefill_per_work_ms: float

    @classmethod
    def from_fits(cls, dec: DecodeAttentionFit, pre: PrefillAttentionFit) -> AttentionPerLayer:
        return cls(
            dec.intercept_ms, dec.per_seq_ms, dec.per_kv_ms, pre.intercept_ms, pre.per_work_ms
        )

    def scaled(
        self, kv_ratio: float, flop_ratio: float, scaling: AttentionScaling
    ) -> AttentionPerLayer:
        """Transfer to another model/TP: see the module docstring (*Attention of the 7B*)."""
        if scaling == "kv-bytes":
            r = kv_ratio
            return AttentionPerLayer(
                self.decode_intercept_ms * r,
                self.decode_per_seq_ms * r,
                self.decode_per_kv_ms * r,
                self.prefill_intercept_ms * r,
                self.prefill_per_work_ms * r,
            )
        return AttentionPerLayer(
            self.decode_intercept_ms,
            self.decode_per_seq_ms,
            self.decode_per_kv_ms * kv_ratio,
            self.prefill_intercept_ms,
            self.prefill_per_work_ms * flop_ratio,
        )

    def as_dict(self) -> dict[str, float]:
        return {k: _round(v, 6) for k, v in vars(self).items()}


def _round(v: float, sig: int = 6) -> float:
    """``v`` to ``sig`` significant digits (keeps the YAML readable and stable)."""
    return float(f"{v:.{sig}g}")


def build_coefficients(
    non_attention: FloorLine,
    attention: AttentionPerLayer,
    num_layers: int,
    all_reduce: AllReduceFit | None,
    allreduce_bytes_per_token: int,
) -> LinearCoefficients:
    """Assemble per-iteration coefficients in seconds from per-layer/per-iteration ms fits."""
    L = num_layers
    comm_intercept = comm_per_token = 0.0
    if all_reduce is not None:
        n_ar = 2 * L + 1
        comm_intercept = n_ar * all_reduce.intercept_ms * MS
        comm_per_token = n_ar * all_reduce.per_byte_ms * allreduce_bytes_per_token * MS
    return LinearCoefficients(
        intercept=INTERCEPT_S,
        token_floor=_round(non_attention.floor * MS),
        token_intercept=_round(non_attention.intercept * MS),
        per_token=_round(non_attention.slope * MS),
        decode_intercept=_round(L * attention.decode_intercept_ms * MS),
        per_decode_seq=_round(L * attention.decode_per_seq_ms * MS),
        per_decode_kv=_round(L * attention.decode_per_kv_ms * MS),
        prefill_intercept=_round(L * attention.prefill_intercept_ms * MS),
        per_prefill_seq=0.0,
        per_prefill_work=_round(L * attention.prefill_per_work_ms * MS),
        comm_intercept=_round(comm_intercept),
        comm_per_token=_round(comm_per_token),
    )


def _non_attention_report(fit: NonAttentionFit, table: pd.DataFrame, path: str) -> dict[str, Any]:
    return {
        "data": path,
        "form": "max(floor, intercept + per_token·T), per iteration, ms",
        "floor_ms": _round(fit.curve.floor),
        "intercept_ms": _round(fit.curve.intercept),
        "per_token_ms": _round(fit.curve.slope),
        "knee_tokens": _round(fit.curve.knee, 4),
        "per_layer_ms_at": {
            int(t): _round(float(v), 4)
            for t, v in zip(table["num_tokens"], table["layer_ms"], strict=True)
            if t in (1, 32, 512, 4096)
        },
        **fit.error.as_dict(),
    }


def _decode_report(fit: DecodeAttentionFit, path: str) -> dict[str, Any]:
    return {
        "data": path,
        "form": "a + b·batch + c·batch·kv, per layer, ms (attn_decode + reshapes)",
        "a_ms": _round(fit.intercept_ms),
        "b_ms": _round(fit.per_seq_ms),
        "c_ms": _round(fit.per_kv_ms),
        **fit.error.as_dict(),
    }


def _prefill_report(fit: PrefillAttentionFit, path: str) -> dict[str, Any]:
    return {
        "data": path,
        "form": "a + w·c·(c + kv), per layer, ms (attn_prefill + reshapes)",
        "a_ms": _round(fit.intercept_ms),
        "w_ms": _round(fit.per_work_ms),
        **fit.error.as_dict(),
    }


def _all_reduce_report(fit: AllReduceFit, path: str, n_ar: int) -> dict[str, Any]:
    return {
        "data": path + " (num_workers == 2)",
        "form": f"a + b·bytes per all-reduce, ms; {n_ar} all-reduces of T·hidden·2 bytes",
        "a_ms": _round(fit.intercept_ms),
        "b_ms_per_byte": _round(fit.per_byte_ms),
        **fit.error.as_dict(),
        "raw_points_in_range": fit.raw_error.as_dict(),
        "raw_points_decode_sizes": fit.decode_size_error.as_dict(),
    }


SOURCE_COMMON = (
    "Fitted by scripts/fit_vidur_profiles.py (sloserve.costmodel.fit) to the GPU operator "
    "timings published by the Vidur project (microsoft/vidur, MIT licence; the tables "
    "live in shared/vidur-profiling, not in this repository). "
)


def fit_builtin_profiles(
    vidur_dir: str | Path, attention_scaling: AttentionScaling = "flops"
) -> dict[str, ReplicaProfile]:
    """Fit both built-in profiles from the Vidur tables under ``vidur_dir``."""
    root = Path(vidur_dir)
    mlp_7b_rel = MLP_CSV.format(model="Llama-2-7b-hf")
    mlp_70b_rel = MLP_CSV.format(model="Llama-2-70b-hf")

    table_7b = load_mlp_table(root / mlp_7b_rel, tp=1, num_layers=LLAMA_2_7B.num_layers)
    table_70b = load_mlp_table(root / mlp_70b_rel, tp=2, num_layers=LLAMA_2_70B.num_layers)
    non_attn_7b = fit_non_attention(table_7b)
    non_attn_70b = fit_non_attention(table_70b)

    decode, prefill = load_attention_tables(root / ATTENTION_70B_TP2_CSV)
    dec_fit = fit_decode_attention(decode)
    pre_fit = fit_prefill_attention(prefill)
    attn_70b = AttentionPerLayer.from_fits(dec_fit, pre_fit)

    ar_bytes_per_token = LLAMA_2_70B.hidden_size * LLAMA_2_70B.dtype_bytes
    ar_fit = fit_all_reduce(
        load_all_reduce(root / ALL_REDUCE_CSV, num_workers=2),
        table_70b["num_tokens"].tolist(),
        ar_bytes_per_token,
    )
    n_ar = 2 * LLAMA_2_70B.num_layers + 1

    kv_70b = kv_bytes_per_token_per_layer_per_gpu(LLAMA_2_70B, 2)
    kv_7b = kv_bytes_per_token_per_layer_per_gpu(LLAMA_2_7B, 1)
    kv_ratio = kv_7b / kv_70b
    flop_ratio = query_width_per_gpu(LLAMA_2_7B, 1) / query_width_per_gpu(LLAMA_2_70B, 2)
    attn_7b = attn_70b.scaled(kv_ratio, flop_ratio, attention_scaling)

    dec_report = _decode_report(dec_fit, ATTENTION_70B_TP2_CSV)
    pre_report = _prefill_report(pre_fit, ATTENTION_70B_TP2_CSV)
    holdout = (
        f"rows sorted by their inputs; every {HOLDOUT_EVERY}th (index % {HOLDOUT_EVERY} == "
        f"{HOLDOUT_EVERY - 1}) held out; coefficients fitted on the rest by relative least "
        "squares; errors are |pred − measured| / measured on the held-out rows"
    )
    missing = "LM head and sampling, KV-cache write and CPU overhead are not modelled"

    coeffs_70b = build_coefficients(
        non_attn_70b.curve, attn_70b, LLAMA_2_70B.num_layers, ar_fit, ar_bytes_per_token
    )
    source_70b = (
        SOURCE_COMMON
        + f"Non-attention: {mlp_70b_rel} (num_tensor_parallel_workers == 2; 9 per-layer "
        "operators × 80 layers + emb once). Attention: "
        f"{ATTENTION_70B_TP2_CSV} (Llama-2-70B TP2, FlashAttention). All-reduce: "
        f"{ALL_REDUCE_CSV} (2 workers), {n_ar} all-reduces of T·8192·2 bytes per iteration. "
        f"intercept = 0: {missing}."
    )
    p70 = ReplicaProfile(
        name="llama-2-70b-a100x2",
        description="Llama-2-70B, tensor-parallel over 2× A100-80GB (NVLink), fp16/bf16",
        model=LLAMA_2_70B,
        gpu=A100_80GB,
        tp=2,
        activation_reserve_gib=ACTIVATION_RESERVE_GIB,
        coefficients=coeffs_70b,
        source=source_70b,
        fit_report={
            "holdout": holdout,
            "groups": {
                "non_attention": _non_attention_report(non_attn_70b, table_70b, mlp_70b_rel),
                "decode_attention": dec_report,
                "prefill_attention": pre_report,
                "all_reduce": _all_reduce_report(ar_fit, ALL_REDUCE_CSV, n_ar),
            },
            "attention_per_layer_ms": attn_70b.as_dict(),
            "not_modelled": missing,
        },
    )

    coeffs_7b = build_coefficients(non_attn_7b.curve, attn_7b, LLAMA_2_7B.num_layers, None, 0)
    if attention_scaling == "flops":
        derivation = (
            f"decode KV term × {kv_ratio:g} (KV bytes per token per layer per GPU: "
            f"7B TP1 {kv_7b:g} vs 70B TP2 {kv_70b:g}; over all layers 524288 vs 163840), "
            "decode intercept and per-sequence term unscaled (same 32 query heads per GPU), "
            f"prefill terms × {flop_ratio:g} (compute bound; query heads × head dim per GPU "
            "is 32×128 in both)"
        )
    else:
        derivation = (
            f"every attention term × {kv_ratio:g} (KV bytes per token per layer per GPU: "
            f"7B TP1 {kv_7b:g} vs 70B TP2 {kv_70b:g})"
        )
    source_7b = (
        SOURCE_COMMON
        + f"Non-attention: {mlp_7b_rel} (num_tensor_parallel_workers == 1; 9 per-layer "
        "operators × 32 layers + emb once). Attention is DERIVED, not measured for this "
        f"model: from the Llama-2-70B TP2 A100 attention fit ({ATTENTION_70B_TP2_CSV}), "
        f"per layer, {derivation}, then × 32 layers. No tensor parallelism, so no "
        f"all-reduce. intercept = 0: {missing}."
    )
    p7 = ReplicaProfile(
        name="llama-2-7b-a100",
        description="Llama-2-7B on one A100-80GB, fp16/bf16",
        model=LLAMA_2_7B,
        gpu=A100_80GB,
        tp=1,
        activation_reserve_gib=ACTIVATION_RESERVE_GIB,
        coefficients=coeffs_7b,
        source=source_7b,
        fit_report={
            "holdout": holdout,
            "groups": {
                "non_attention": _non_attention_report(non_attn_7b, table_7b, mlp_7b_rel),
                "decode_attention": {"derived_from": "llama-2-70b-a100x2", **dec_report},
                "prefill_attention": {"derived_from": "llama-2-70b-a100x2", **pre_report},
            },
            "attention_scaling": attention_scaling,
            "attention_derivation": derivation,
            "attention_per_layer_ms": attn_7b.as_dict(),
            "not_modelled": missing,
        },
    )
    return {p7.name: p7, p70.name: p70}
