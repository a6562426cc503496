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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml
from numpy.typing import NDArray
from pydantic import ValidationError

from sloserve.core.csvio import read_strict_csv
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


# --------------------------------------------------------------------------- profile CSVs

CSV_INPUT_COLUMNS: tuple[str, ...] = (
    "num_prefill_tokens",
    "num_prefill_seqs",
    "prefill_attn_work",
    "num_decode",
    "decode_context_sum",
)
"""The :class:`BatchStats` aggregates of a measured iteration (required, integers ≥ 0)."""

CSV_TIME_COLUMN = "time_s"
"""Seconds of one measured iteration (required, > 0)."""

CSV_REQUIRED_COLUMNS: tuple[str, ...] = (*CSV_INPUT_COLUMNS, CSV_TIME_COLUMN)

CSV_GROUP_COLUMNS: dict[str, str] = {
    "non_attention": "time_non_attention_s",
    "decode_attention": "time_decode_attention_s",
    "prefill_attention": "time_prefill_attention_s",
    "comm": "time_comm_s",
}
"""Optional per-group times (seconds), by group name."""

MODEL_COLUMN_PREFIX = "model_"
DEVICE_COLUMN_PREFIX = "device_"

CSV_METADATA_COLUMNS: tuple[str, ...] = (
    "device",
    "model",
    "dtype",
    "tp",
    *(DEVICE_COLUMN_PREFIX + f for f in GPUSpec.model_fields if f != "name"),
    *(MODEL_COLUMN_PREFIX + f for f in ModelSpec.model_fields if f != "name"),
)
"""Columns describing the setting; each must hold one value over the whole file."""

CSV_INFO_COLUMNS: tuple[str, ...] = ("kind", "repeats", "time_min_s", "time_max_s")
"""Informational columns the profiler writes; read by people, not by the fit."""

MIN_CSV_POINTS = HOLDOUT_EVERY
"""Fewest distinct measured batches :func:`fit_profile_table` accepts (one is held out)."""

_DECODE_TERMS = ("decode_intercept", "per_decode_seq", "per_decode_kv")
_PREFILL_TERMS = ("prefill_intercept", "per_prefill_seq", "per_prefill_work")
_RANK_RTOL = 1e-7
"""A column whose normalised residual against the kept columns is below this is dropped."""

CSV_HOLDOUT = (
    f"rows with identical aggregates merged (median); points sorted by their aggregates; every "
    f"{HOLDOUT_EVERY}th (index % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1}) held out for every "
    "group; coefficients fitted on the rest by relative least squares; errors are "
    "|pred − measured| / measured on the held-out points"
)


@dataclass(frozen=True)
class ProfileTable:
    """A validated measured-iteration table (the CSV format in the module docstring)."""

    frame: pd.DataFrame
    """One row per measured batch: the input columns (int64), ``time_s`` and the group
    columns that exist (float64, NaN where not measured)."""
    source: str
    """The file (or ``<DataFrame>``) the rows came from, for messages."""
    metadata: dict[str, Any]
    """The value of every metadata column present (constant over the file)."""
    ignored_columns: tuple[str, ...] = ()
    """Columns that are neither measured, metadata nor informational."""


class _LineMap:
    """Data row index → file line (1-based; the header and blank lines count)."""

    def __init__(self, lines: NDArray[np.int64]) -> None:
        self.lines = lines

    def __call__(self, idx: int) -> int:
        return int(self.lines[idx])


def _csv_error(source: str, line: int, column: str, msg: str) -> ConfigError:
    return ConfigError(f"{source}: line {line}, column {column}: {msg}")


def read_profile_csv(path: str | Path) -> ProfileTable:
    """Read and validate a measured-iteration CSV.

    Raises :class:`ConfigError` naming the file, line and column of the first problem.
    """
    p = Path(path)
    df, lines = read_strict_csv(p, "profile CSV", ConfigError)
    if any(c.startswith("Unnamed:") for c in df.columns):
        raise ConfigError(f"{p}: line 1: a column has no name (or a row has too many fields)")
    return validate_profile_frame(df, source=str(p), lines=lines)


def _numeric(df: pd.DataFrame, col: str, source: str, line: _LineMap, required: bool) -> FloatArray:
    raw = df[col]
    num = pd.to_numeric(raw, errors="coerce")
    bad = (num.isna() & raw.notna()).to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _csv_error(source, line(i), col, f"not a number ({raw.iloc[i]!r})")
    out = num.to_numpy(dtype=np.float64)
    if required and np.isnan(out).any():
        i = int(np.flatnonzero(np.isnan(out))[0])
        raise _csv_error(source, line(i), col, "empty cell; a value is required")
    return out


def _first(mask: NDArray[np.bool_]) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def validate_profile_frame(
    df: pd.DataFrame, source: str = "<DataFrame>", lines: NDArray[np.int64] | None = None
) -> ProfileTable:
    """Validate a measured-iteration table already in memory (e.g. from the profiler).

    ``lines`` maps each row to its file line for messages; by default row ``i`` is line
    ``i + 2`` (a header line, no blank lines).
    """
    line = _LineMap(np.arange(len(df), dtype=np.int64) + 2 if lines is None else np.asarray(lines))
    cols = [str(c) for c in df.columns]
    missing = [c for c in CSV_REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise ConfigError(
            f"{source}: line 1, column(s) {', '.join(missing)}: missing; "
            f"have {', '.join(cols) or '(none)'}"
        )
    if len(df) == 0:
        raise ConfigError(f"{source}: no measured rows")

    out = pd.DataFrame(index=pd.RangeIndex(len(df)))
    ints: dict[str, NDArray[np.int64]] = {}
    for col in CSV_INPUT_COLUMNS:
        v = _numeric(df, col, source, line, required=True)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(v) | (v < 0) | (v != np.floor(v))
        if (i := _first(bad)) is not None:
            raise _csv_error(source, line(i), col, f"must be an integer >= 0 ({v[i]:g})")
        ints[col] = v.astype(np.int64)
        out[col] = ints[col]
    n_p, seqs, work = (
        ints["num_prefill_tokens"],
        ints["num_prefill_seqs"],
        ints["prefill_attn_work"],
    )
    n_d, ctx = ints["num_decode"], ints["decode_context_sum"]
    checks: list[tuple[NDArray[np.bool_], str, str]] = [
        (n_p + n_d == 0, "num_prefill_tokens", "an empty batch (no prefill and no decode tokens)"),
        ((n_p == 0) & (seqs > 0), "num_prefill_seqs", "must be 0 when num_prefill_tokens is 0"),
        ((n_p > 0) & (seqs == 0), "num_prefill_seqs", "must be >= 1 when there is prefill"),
        (seqs > n_p, "num_prefill_seqs", "more prefill chunks than prefill tokens"),
        ((n_p == 0) & (work > 0), "prefill_attn_work", "must be 0 when num_prefill_tokens is 0"),
        (
            (n_p > 0) & (work < n_p),
            "prefill_attn_work",
            "must be >= num_prefill_tokens (Σ c·(c + ctx) >= Σ c)",
        ),
        ((n_d == 0) & (ctx > 0), "decode_context_sum", "must be 0 when num_decode is 0"),
    ]
    for bad, col, msg in checks:
        if (i := _first(bad)) is not None:
            raise _csv_error(source, line(i), col, msg)

    t = _numeric(df, CSV_TIME_COLUMN, source, line, required=True)
    if (i := _first(~np.isfinite(t) | (t <= 0))) is not None:
        raise _csv_error(source, line(i), CSV_TIME_COLUMN, f"must be a finite time > 0 ({t[i]})")
    out[CSV_TIME_COLUMN] = t

    kinds = {"decode_attention": (n_d > 0, "decode"), "prefill_attention": (n_p > 0, "prefill")}
    parts = np.zeros(len(df))
    for group, col in CSV_GROUP_COLUMNS.items():
        if col not in cols:
            continue
        v = _numeric(df, col, source, line, required=False)
        present = ~np.isnan(v)
        with np.errstate(invalid="ignore"):
            bad = present & (~np.isfinite(v) | (v < 0))
        if (i := _first(bad)) is not None:
            raise _csv_error(source, line(i), col, f"must be a finite time >= 0 ({v[i]})")
        if (i := _first(present & (v > t))) is not None:
            raise _csv_error(source, line(i), col, f"larger than time_s ({v[i]} > {t[i]})")
        if group in kinds:
            has, what = kinds[group]
            if (i := _first(has & ~(v > 0))) is not None:
                raise _csv_error(
                    source,
                    line(i),
                    col,
                    f"must be > 0 on a row with {what} ({'empty' if np.isnan(v[i]) else v[i]})",
                )
            if (i := _first(~has & present & (v != 0))) is not None:
                raise _csv_error(
                    source, line(i), col, f"must be empty or 0 on a row without {what}"
                )
        if group != "non_attention":
            parts += np.nan_to_num(v)
        out[col] = v
    if (i := _first(parts >= t)) is not None:
        raise _csv_error(
            source,
            line(i),
            CSV_TIME_COLUMN,
            f"not larger than the sum of the attention and comm times ({t[i]} <= {parts[i]:g})",
        )

    metadata: dict[str, Any] = {}
    for col in CSV_METADATA_COLUMNS:
        if col not in cols:
            continue
        vals = df[col]
        keep = vals.notna() & (vals.astype(str).str.strip() != "")
        if not keep.any():
            continue
        text = vals.astype(str).str.strip()
        first = int(np.flatnonzero(keep.to_numpy())[0])
        ref = text.iloc[first]
        if (i := _first((keep & (text != ref)).to_numpy())) is not None:
            raise _csv_error(
                source,
                line(i),
                col,
                f"one profile describes one setting: {text.iloc[i]!r} here, "
                f"{ref!r} on line {line(first)}",
            )
        metadata[col] = vals.iloc[first]
    known = {*CSV_REQUIRED_COLUMNS, *CSV_GROUP_COLUMNS.values(), *CSV_METADATA_COLUMNS}
    known.update(CSV_INFO_COLUMNS)
    ignored = tuple(c for c in cols if c not in known)
    return ProfileTable(out, source, metadata, ignored)


# --------------------------------------------------------------------------- CSV fitting


def _merge_duplicates(frame: pd.DataFrame) -> pd.DataFrame:
    """One point per distinct aggregate tuple (median of every time), sorted by aggregates."""
    merged = frame.groupby(list(CSV_INPUT_COLUMNS), as_index=False, sort=True).median()
    return merged.reset_index(drop=True)


def _select_columns(x: FloatArray, y: FloatArray, order: Sequence[int]) -> list[int]:
    """Columns of ``x`` (tried in ``order``) that are not combinations of those kept before.

    Works on the relative-error-weighted, column-normalised matrix, so the test matches the
    least-squares problem actually solved.
    """
    xw = x / y[:, None]
    kept: list[int] = []
    for j in order:
        col = xw[:, j]
        norm = float(np.linalg.norm(col))
        if norm == 0:
            continue
        col = col / norm
        if kept:
            basis = xw[:, kept] / np.linalg.norm(xw[:, kept], axis=0)
            sol, *_ = np.linalg.lstsq(basis, col, rcond=None)
            resid = float(np.linalg.norm(col - basis @ sol))
        else:
            resid = 1.0
        if resid > _RANK_RTOL**0.5:
            kept.append(j)
    return kept


def _fit_terms(
    columns: Mapping[str, FloatArray], y: FloatArray, priority: Sequence[str], signed: Sequence[str]
) -> tuple[dict[str, float], list[str]]:
    """Relative least squares of ``y`` on the named columns; (coefficients, dropped names).

    Columns are kept in ``priority`` order while identifiable; all but ``signed`` are ≥ 0.
    """
    names = list(priority)
    x = np.column_stack([columns[n] for n in names])
    kept = _select_columns(x, y, range(len(names)))
    coef = relative_lstsq(x[:, kept], y, [names[j] not in signed for j in kept])
    out = dict.fromkeys(names, 0.0)
    for j, c in zip(kept, coef, strict=True):
        out[names[j]] = float(c)
    return out, [n for j, n in enumerate(names) if j not in kept]


@dataclass(frozen=True)
class _Points:
    """The merged points of a profile table as arrays."""

    n_p: FloatArray
    seqs: FloatArray
    work: FloatArray
    n_d: FloatArray
    ctx: FloatArray
    time: FloatArray

    @property
    def tokens(self) -> FloatArray:
        return self.n_p + self.n_d

    @classmethod
    def of(cls, frame: pd.DataFrame) -> _Points:
        def col(name: str) -> FloatArray:
            return frame[name].to_numpy(dtype=np.float64)

        return cls(
            col("num_prefill_tokens"),
            col("num_prefill_seqs"),
            col("prefill_attn_work"),
            col("num_decode"),
            col("decode_context_sum"),
            col(CSV_TIME_COLUMN),
        )

    def subset(self, mask: NDArray[np.bool_]) -> _Points:
        return _Points(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


def _predict(c: Mapping[str, float], p: _Points) -> FloatArray:
    """:class:`LinearCostModel`'s formula, vectorised over points."""
    tokens = p.tokens
    t = (
        c["intercept"]
        + np.maximum(c["token_floor"], c["token_intercept"] + c["per_token"] * tokens)
        + c["comm_intercept"]
        + c["comm_per_token"] * tokens
    )
    dec = c["decode_intercept"] + c["per_decode_seq"] * p.n_d + c["per_decode_kv"] * p.ctx
    pre = c["prefill_intercept"] + c["per_prefill_seq"] * p.seqs + c["per_prefill_work"] * p.work
    out: FloatArray = t + np.where(p.n_d > 0, dec, 0.0) + np.where(p.n_p > 0, pre, 0.0)
    return out


def _clean(v: Any) -> Any:
    """Report values as plain, YAML/JSON-safe Python (NaN → None, numpy → builtins)."""
    if isinstance(v, Mapping):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, float | np.floating):
        f = float(v)
        return None if not math.isfinite(f) else f
    return v


def _metrics(pred: FloatArray, meas: FloatArray, n_train: int) -> dict[str, Any]:
    """Held-out error dict (the :class:`FitError` keys; None where there is no test point)."""
    if meas.size == 0:
        return {
            "r2": None,
            "median_rel_err": None,
            "p90_rel_err": None,
            "max_rel_err": None,
            "n_train": n_train,
            "n_test": 0,
        }
    return dict(_clean(error_report(pred, meas, n_train).as_dict()))


def _group_fit(
    name: str,
    form: str,
    target: str,
    columns: Mapping[str, FloatArray],
    y: FloatArray,
    rows: NDArray[np.bool_],
    test: NDArray[np.bool_],
    priority: Sequence[str],
    source: str,
) -> tuple[dict[str, float], dict[str, Any], list[str]]:
    train = rows & ~test
    if not train.any():
        raise ConfigError(
            f"{source}: no training points for {name} (every {HOLDOUT_EVERY}th point is "
            "held out); measure more batches of that kind"
        )
    sub = {k: v[train] for k, v in columns.items()}
    coef, dropped = _fit_terms(sub, y[train], priority, signed=())
    x_test = np.column_stack([columns[n][rows & test] for n in priority])
    pred = x_test @ np.array([coef[n] for n in priority]) if x_test.size else np.zeros(0)
    report: dict[str, Any] = {
        "form": form,
        "target": target,
        "coefficients_s": {k: _round(v) for k, v in coef.items()},
        "dropped": dropped,
        **_metrics(pred, y[rows & test], int(train.sum())),
    }
    return coef, report, dropped


def _fit_total_joint(p: _Points, train: NDArray[np.bool_]) -> tuple[dict[str, float], list[str]]:
    """Every term jointly to ``time_s`` (total mode; see the module docstring)."""
    q = p.subset(train)
    tokens = q.tokens
    ones = np.ones_like(tokens)
    has_d, has_p = (q.n_d > 0).astype(np.float64), (q.n_p > 0).astype(np.float64)
    priority = (
        "token_floor",
        "token_intercept",
        "per_token",
        "per_decode_kv",
        "per_prefill_work",
        "decode_intercept",
        "prefill_intercept",
        "per_decode_seq",
        "per_prefill_seq",
    )
    zero = dict.fromkeys(LinearCoefficients.model_fields, 0.0)
    best: tuple[float, dict[str, float], list[str]] | None = None
    distinct = np.unique(tokens)
    # A threshold splits the points into a flat prefix (tokens < thr) and a linear suffix.
    for thr in [*distinct, np.inf]:
        flat = tokens < thr
        lin = ~flat
        cols = {
            "token_floor": flat * ones,
            "token_intercept": lin * ones,
            "per_token": lin * tokens,
            "decode_intercept": has_d,
            "per_decode_seq": q.n_d,
            "per_decode_kv": q.ctx,
            "prefill_intercept": has_p,
            "per_prefill_seq": q.seqs,
            "per_prefill_work": q.work,
        }
        coef, dropped = _fit_terms(cols, q.time, priority, signed=("token_intercept",))
        full = {**zero, **coef}
        loss = float(np.sum(((_predict(full, q) - q.time) / q.time) ** 2))
        if best is None or loss < best[0]:
            best = (loss, full, dropped)
    assert best is not None
    return best[1], best[2]


def _kind_masks(p: _Points) -> dict[str, NDArray[np.bool_]]:
    return {
        "decode_only": (p.n_d > 0) & (p.n_p == 0),
        "prefill_only": (p.n_p > 0) & (p.n_d == 0),
        "hybrid": (p.n_p > 0) & (p.n_d > 0),
    }


def fit_profile_table(table: ProfileTable) -> tuple[LinearCoefficients, dict[str, Any]]:
    """Fit :class:`LinearCoefficients` to a validated table; (coefficients, report).

    Per-group mode when the attention columns cover every kind of row present, else total
    mode (module docstring, *Measured-iteration CSVs*). The report is plain data (YAML/JSON
    safe) with the held-out R² and relative errors of every fitted group and of the total.
    """
    source = table.source
    frame = _merge_duplicates(table.frame)
    n = len(frame)
    if n < MIN_CSV_POINTS:
        raise ConfigError(
            f"{source}: {n} distinct measured batches; need at least {MIN_CSV_POINTS} "
            f"(every {HOLDOUT_EVERY}th is held out)"
        )
    p = _Points.of(frame)
    test = holdout_mask(n)
    train = ~test
    tokens = p.tokens
    if np.unique(tokens[train]).size < 2:
        raise ConfigError(
            f"{source}: the training points have one token count; the per-token cost needs "
            "at least two (vary the chunk sizes and batch sizes)"
        )
    has_d, has_p = p.n_d > 0, p.n_p > 0
    col_dec = CSV_GROUP_COLUMNS["decode_attention"]
    col_pre = CSV_GROUP_COLUMNS["prefill_attention"]
    col_comm = CSV_GROUP_COLUMNS["comm"]
    dec_ok = not has_d.any() or col_dec in frame.columns
    pre_ok = not has_p.any() or col_pre in frame.columns
    any_attn = col_dec in frame.columns or col_pre in frame.columns
    per_group = dec_ok and pre_ok and any_attn

    def group_time(col: str) -> FloatArray:
        if col not in frame.columns:
            return np.zeros(n)
        out: FloatArray = np.nan_to_num(frame[col].to_numpy(dtype=np.float64))
        return out

    coef: dict[str, float] = dict.fromkeys(LinearCoefficients.model_fields, 0.0)
    groups: dict[str, Any] = {}
    dropped: list[str] = []
    notes: list[str] = []
    if per_group:
        ones = np.ones(n)
        dec_t, pre_t, comm_t = group_time(col_dec), group_time(col_pre), group_time(col_comm)
        if has_d.any():
            c, rep, dr = _group_fit(
                "decode attention",
                "decode_intercept + per_decode_seq·num_decode + per_decode_kv·decode_context_sum",
                col_dec,
                {"decode_intercept": ones, "per_decode_seq": p.n_d, "per_decode_kv": p.ctx},
                dec_t,
                has_d,
                test,
                ("per_decode_kv", "decode_intercept", "per_decode_seq"),
                source,
            )
            coef.update(c)
            groups["decode_attention"] = rep
            dropped += dr
        if has_p.any():
            c, rep, dr = _group_fit(
                "prefill attention",
                "prefill_intercept + per_prefill_seq·num_prefill_seqs "
                "+ per_prefill_work·prefill_attn_work",
                col_pre,
                {"prefill_intercept": ones, "per_prefill_seq": p.seqs, "per_prefill_work": p.work},
                pre_t,
                has_p,
                test,
                ("per_prefill_work", "prefill_intercept", "per_prefill_seq"),
                source,
            )
            coef.update(c)
            groups["prefill_attention"] = rep
            dropped += dr
        comm_rows = comm_t > 0
        if comm_rows.any():
            c, rep, dr = _group_fit(
                "comm",
                "comm_intercept + comm_per_token·T",
                col_comm,
                {"comm_intercept": ones, "comm_per_token": tokens},
                comm_t,
                comm_rows,
                test,
                ("comm_intercept", "comm_per_token"),
                source,
            )
            coef.update(c)
            groups["comm"] = rep
            dropped += dr
        rest = p.time - dec_t - pre_t - comm_t
        curve = fit_floor_line(tokens[train], rest[train])
        coef.update(token_floor=curve.floor, token_intercept=curve.intercept, per_token=curve.slope)
        groups["non_attention"] = {
            "form": "max(token_floor, token_intercept + per_token·T), T = all tokens",
            "target": "time_s − Σ(attention, comm): the remainder of each iteration",
            "coefficients_s": {
                "token_floor": _round(curve.floor),
                "token_intercept": _round(curve.intercept),
                "per_token": _round(curve.slope),
            },
            "knee_tokens": _round(curve.knee, 4),
            **_metrics(curve(tokens[test]), rest[test], int(train.sum())),
        }
        col_na = CSV_GROUP_COLUMNS["non_attention"]
        if col_na in frame.columns:
            na = frame[col_na].to_numpy(dtype=np.float64)
            ok = ~np.isnan(na)
            if ok.any():
                groups["non_attention"]["measured_over_remainder_median"] = _round(
                    float(np.median(na[ok] / rest[ok])), 4
                )
    else:
        full, dropped = _fit_total_joint(p, train)
        coef.update(full)
        if any_attn:
            notes.append(
                "attention columns do not cover every kind of batch present: fitted to time_s"
            )
        if col_comm in frame.columns:
            notes.append("comm cannot be separated from totals: folded into per_token")
    coefficients = LinearCoefficients(**{k: _round(v) for k, v in coef.items()})

    cm = LinearCostModel(coefficients)
    pred = np.array(
        [
            cm.batch_time(BatchStats(int(a), int(b), int(c), int(d), int(e)))
            for a, b, c, d, e in frame[list(CSV_INPUT_COLUMNS)].itertuples(index=False)
        ],
        dtype=np.float64,
    )
    n_train = int(train.sum())
    total: dict[str, Any] = {
        "form": "LinearCostModel.batch_time with the fitted coefficients",
        **_metrics(pred[test], p.time[test], n_train),
        "train": _metrics(pred[train], p.time[train], n_train),
        "by_kind": {
            kind: _metrics(pred[m & test], p.time[m & test], int((m & train).sum()))
            for kind, m in _kind_masks(p).items()
            if m.any()
        },
    }
    report: dict[str, Any] = {
        "data": source,
        "mode": "per-group" if per_group else "total",
        "rows": len(table.frame),
        "points": n,
        "holdout": CSV_HOLDOUT,
        "groups": groups,
        "total": total,
        "dropped_terms": sorted(set(dropped)),
        "metadata": {k: str(v) for k, v in table.metadata.items()},
        "ignored_columns": list(table.ignored_columns),
    }
    if notes:
        report["notes"] = notes
    return coefficients, _clean(report)


def fit_profile_csv(path: str | Path) -> tuple[LinearCoefficients, dict[str, Any]]:
    """Fit a measured-iteration CSV (see the module docstring); (coefficients, report).

    Raises :class:`ConfigError` naming file, line and column for a malformed CSV.
    """
    return fit_profile_table(read_profile_csv(path))


def fit_profile_frame(
    df: pd.DataFrame, source: str = "<DataFrame>"
) -> tuple[LinearCoefficients, dict[str, Any]]:
    """:func:`fit_profile_csv` for a table in memory (e.g. :func:`profile_model`'s output)."""
    return fit_profile_table(validate_profile_frame(df.reset_index(drop=True), source))


def format_fit_report(report: Mapping[str, Any]) -> str:
    """A few lines for a terminal: mode, points, and held-out errors per group and total."""

    def line(name: str, g: Mapping[str, Any]) -> str:
        if not g.get("n_test"):
            return f"  {name}: no held-out points (n_train {g.get('n_train')})"
        r2 = g.get("r2")
        r2s = "n/a" if r2 is None else f"{r2:.4f}"
        return (
            f"  {name}: held-out median rel err {g['median_rel_err']:.1%}, "
            f"p90 {g['p90_rel_err']:.1%}, max {g['max_rel_err']:.1%}, R² {r2s} "
            f"(train {g['n_train']}, test {g['n_test']})"
        )

    out = [
        f"{report.get('data')}: {report.get('points')} distinct batches "
        f"({report.get('rows')} rows), {report.get('mode')} fit"
    ]
    for name, g in report.get("groups", {}).items():
        out.append(line(name, g))
    total = report.get("total", {})
    out.append(line("total", total))
    for kind, g in total.get("by_kind", {}).items():
        out.append(line(f"total, {kind}", g))
    if report.get("dropped_terms"):
        out.append(f"  not identifiable, fixed at 0: {', '.join(report['dropped_terms'])}")
    out.extend(f"  note: {n}" for n in report.get("notes", []))
    return "\n".join(out)


# --------------------------------------------------------------------------- BROS / Aladdin


def _nonneg(source: str, **values: float) -> None:
    for k, v in values.items():
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"{source}: {k} must be a finite number >= 0, got {v}")


def bros_coefficients(
    *,
    prefill_alpha0: float,
    prefill_alpha1: float,
    prefill_beta: float,
    decode_alpha0: float,
    decode_alpha1: float,
    decode_beta: float,
) -> LinearCoefficients:
    """BROS's ``α0·Ln + α1·Ln·La + β`` (one fit for prefill, one for decode, summed).

    Exact on every batch (``Ln·La`` read per request, see the module docstring) provided
    ``decode_alpha0 >= prefill_alpha0``; otherwise :class:`ConfigError`.
    """
    _nonneg(
        "BROS cost model",
        prefill_alpha0=prefill_alpha0,
        prefill_alpha1=prefill_alpha1,
        prefill_beta=prefill_beta,
        decode_alpha0=decode_alpha0,
        decode_alpha1=decode_alpha1,
        decode_beta=decode_beta,
    )
    if decode_alpha0 < prefill_alpha0:
        raise ConfigError(
            f"BROS cost model: decode_alpha0 ({decode_alpha0}) < prefill_alpha0 "
            f"({prefill_alpha0}) is not representable: LinearCoefficients has one per-token "
            "term shared by prefill and decode tokens and no per-prefill-token term"
        )
    return LinearCoefficients(
        per_token=prefill_alpha0,
        per_decode_seq=decode_alpha0 - prefill_alpha0,
        per_decode_kv=decode_alpha1,
        decode_intercept=decode_beta,
        per_prefill_work=prefill_alpha1,
        prefill_intercept=prefill_beta,
    )


def aladdin_coefficients(
    *, k1: float, c1: float, k2: float, c2: float, c3: float
) -> LinearCoefficients:
    """Aladdin's prefill ``k1·Σl_in + c1`` and decode ``(k2·l_ave + c2)·b + c3``.

    Exact on prefill-only and decode-only batches (Aladdin prices no others; a hybrid batch
    costs the sum) provided ``c2 >= k1``; otherwise :class:`ConfigError`.
    """
    _nonneg("Aladdin cost model", k1=k1, c1=c1, k2=k2, c2=c2, c3=c3)
    if c2 < k1:
        raise ConfigError(
            f"Aladdin cost model: c2 ({c2}) < k1 ({k1}) is not representable: "
            "LinearCoefficients has one per-token term shared by prefill and decode tokens "
            "and no per-prefill-token term"
        )
    return LinearCoefficients(
        per_token=k1,
        prefill_intercept=c1,
        per_decode_kv=k2,
        per_decode_seq=c2 - k1,
        decode_intercept=c3,
    )


# --------------------------------------------------------------------------- fitted profiles

PROFILE_YAML_HEADER = (
    "# Fitted by sloserve (sloserve.costmodel.fit.fit_profile_csv) from measured iterations.\n"
    "# Refit rather than edit: sloserve costmodel fit PROFILE.csv --out THIS.yaml\n"
)


def _metadata_spec(
    cls: Callable[..., Any],
    fields: Mapping[str, Any],
    prefix: str,
    name: Any,
    metadata: Mapping[str, Any],
    source: str,
) -> Any:
    given = {f: metadata[prefix + f] for f in fields if f != "name" and prefix + f in metadata}
    required = [f for f, info in fields.items() if f != "name" and info.is_required()]
    if name is None or any(f not in given for f in required):
        return None
    try:
        return cls(name=str(name), **given)
    except ValidationError as e:
        err = e.errors()[0]
        col = "model" if err["loc"] == ("name",) else prefix + ".".join(map(str, err["loc"]))
        raise ConfigError(f"{source}: column {col}: {err['msg']}") from e


def hardware_from_metadata(
    metadata: Mapping[str, Any], source: str = "<metadata>"
) -> tuple[ModelSpec | None, GPUSpec | None, int | None]:
    """(model, GPU, tp) described by a table's metadata columns; None where incomplete.

    A model needs ``model`` and every required ``model_<field>``; a GPU needs ``device`` and
    ``device_memory_gib``.
    """
    model = _metadata_spec(
        ModelSpec,
        ModelSpec.model_fields,
        MODEL_COLUMN_PREFIX,
        metadata.get("model"),
        metadata,
        source,
    )
    gpu = _metadata_spec(
        GPUSpec,
        GPUSpec.model_fields,
        DEVICE_COLUMN_PREFIX,
        metadata.get("device"),
        metadata,
        source,
    )
    tp: int | None = None
    if "tp" in metadata:
        try:
            tp = int(float(metadata["tp"]))
        except ValueError:
            raise ConfigError(f"{source}: column tp: not an integer ({metadata['tp']!r})") from None
    return model, gpu, tp


def profile_from_coefficients(
    coefficients: LinearCoefficients,
    *,
    name: str,
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int = 1,
    source: str,
    description: str = "",
    fit_report: Mapping[str, Any] | None = None,
    activation_reserve_gib: float = ACTIVATION_RESERVE_GIB,
) -> ReplicaProfile:
    """A :class:`ReplicaProfile` from fitted coefficients and the hardware they describe."""
    try:
        return ReplicaProfile(
            name=name,
            description=description,
            model=model,
            gpu=gpu,
            tp=tp,
            activation_reserve_gib=activation_reserve_gib,
            coefficients=coefficients,
            source=source,
            fit_report=dict(_clean(dict(fit_report or {}))),
        )
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"profile {name}: field {loc}: {err['msg']}") from e


def profile_from_csv(
    path: str | Path,
    *,
    name: str | None = None,
    model: ModelSpec | None = None,
    gpu: GPUSpec | None = None,
    tp: int | None = None,
    base_profile: str | None = None,
    description: str = "",
) -> ReplicaProfile:
    """Fit a measured-iteration CSV and assemble a profile (``sloserve costmodel fit``).

    The model, GPU and TP degree come from, in order: the arguments, ``base_profile`` (a
    built-in profile name or YAML path whose hardware the measurements describe), the CSV's
    metadata columns. ``name`` defaults to the CSV's file stem.
    """
    p = Path(path)
    table = read_profile_csv(p)
    coefficients, report = fit_profile_table(table)
    base = load_profile(base_profile) if base_profile else None
    meta_model, meta_gpu, meta_tp = hardware_from_metadata(table.metadata, str(p))
    model = model or (base.model if base else None) or meta_model
    gpu = gpu or (base.gpu if base else None) or meta_gpu
    if model is None or gpu is None:
        what = "model shape (model and model_* columns)" if model is None else "device"
        raise ConfigError(
            f"{p}: no {what} in the CSV; pass a base profile (its model and GPU are used) "
            "or a ModelSpec and GPUSpec"
        )
    tp = tp or (base.tp if base else None) or meta_tp or 1
    reserve = base.activation_reserve_gib if base else ACTIVATION_RESERVE_GIB
    setting = ", ".join(
        f"{k} {v}" for k, v in report["metadata"].items() if k in ("device", "dtype")
    )
    total = report["total"]
    err = total.get("median_rel_err")
    source = (
        f"Fitted by sloserve.costmodel.fit.fit_profile_csv to {p.name}: {report['points']} "
        f"distinct measured iterations ({setting or 'setting not recorded'}), "
        f"{report['mode']} fit"
        + (f", held-out median relative error {err:.1%}" if err is not None else "")
        + (f"; model and GPU from profile {base.name}" if base else "")
        + "."
    )
    return profile_from_coefficients(
        coefficients,
        name=name or p.stem,
        model=model,
        gpu=gpu,
        tp=tp,
        source=source,
        description=description or f"{model.name} on {gpu.name}, TP{tp}, measured",
        fit_report=report,
        activation_reserve_gib=reserve,
    )


def render_profile_yaml(profile: ReplicaProfile, header: str = PROFILE_YAML_HEADER) -> str:
    """The YAML text of a profile, fields in schema order (as the built-in files)."""
    data: dict[str, Any] = profile.model_dump(mode="json")
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def write_profile_yaml(
    profile: ReplicaProfile, path: str | Path, header: str = PROFILE_YAML_HEADER
) -> Path:
    """Write a profile YAML that ``load_profile(path)`` / ``--profile path`` reads back."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(render_profile_yaml(profile, header), encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot write profile ({e.strerror})") from e
    return p
