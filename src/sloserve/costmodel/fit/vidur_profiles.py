"""The two original built-in profiles, fitted from Vidur's operator tables.

``scripts/fit_vidur_profiles.py`` historically ran :func:`fit_builtin_profiles` to write:

:func:`fit_builtin_profiles` and writes the two built-in profiles:

* ``llama-2-70b-a100x2``: Llama-2-70B, TP2 on two A100-80GB. Linear operators, attention
  and all-reduce are all measured in that setting.
* ``llama-2-7b-a100``: Llama-2-7B on one A100-80GB. Linear operators are measured; **the
  attention terms are derived from the 70B TP2 attention measurements** (no 7B attention
  table is public), see *Attention of the 7B profile* below.

The operator groups are fitted in :mod:`.vidur_tables`; this module transfers the attention
fits between models (:class:`AttentionPerLayer`) and assembles per-iteration coefficients
(:func:`build_coefficients`, also used by :mod:`sloserve.costmodel.calibrate`).

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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel.fit.lstsq import HOLDOUT_EVERY, FloorLine, _round
from sloserve.costmodel.fit.vidur_tables import (
    ALL_REDUCE_CSV,
    ATTENTION_70B_TP2_CSV,
    INTERCEPT_S,
    MLP_CSV,
    MS,
    AllReduceFit,
    DecodeAttentionFit,
    NonAttentionFit,
    PrefillAttentionFit,
    fit_all_reduce,
    fit_decode_attention,
    fit_non_attention,
    fit_prefill_attention,
    load_all_reduce,
    load_attention_tables,
    load_mlp_table,
)
from sloserve.costmodel.fit.writer import ACTIVATION_RESERVE_GIB
from sloserve.costmodel.linear import LinearCoefficients
from sloserve.costmodel.profile import ReplicaProfile

AttentionScaling = Literal["flops", "kv-bytes"]

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
    n_ar = 2 * LLAMA_2_70B.num_layers + 1
    ar_fit = fit_all_reduce(
        load_all_reduce(root / ALL_REDUCE_CSV, num_workers=2),
        table_70b["num_tokens"].tolist(),
        ar_bytes_per_token,
        iteration=(n_ar, non_attn_70b.curve),
    )

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
