"""One calibrated profile per Vidur model/GPU pair (``scripts/fit_vidur_profiles.py``).

Attention comes from :mod:`.attention`, the TP choice from :mod:`.pairs`; this module fits
the rest per pair and assembles the profile and its fit report.

Non-attention
    Fitted per pair from its ``mlp.csv`` rows at the chosen TP
    (:func:`vidur_tables.fit_non_attention`: ``max(floor, intercept + per_token·T)``, held-out
    error reported). phi-2's parallel block has no ``post_attention_layernorm`` column; absent
    per-layer operators count as 0 (vidur_tables' loader requires all nine, so phi-2 uses
    :func:`load_mlp`'s own equivalent).

All-reduce
    Fitted (:func:`vidur_tables.fit_all_reduce`, at the message sizes the pair's token grid
    produces) on the topology a replica of that TP would run on: TP2 on ``<gpu>_pairwise_nvlink``
    (two NVLink-joined GPUs, as the original 70B profile), TP4/8 on ``<gpu>_dgx`` rows with
    ``devices_per_node == num_workers`` (one NVSwitch node; the ``a100_dgx`` file mixes in
    cross-node rows with fewer devices per node, which vidur_tables' loader would merge). Sizes
    beyond the largest measured message are left out of the fit (the line extrapolates).
    There is no A40 all-reduce data: A40 profiles use the roofline all-reduce (NVLink bridge
    for TP2, PCIe beyond; default link efficiency and latency), listed under
    ``fit_report.derived_terms``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.costmodel.calibrate.attention import (
    AttentionCalibration,
    _kv_bytes_layer_gpu,
    calibrate_attention,
)
from sloserve.costmodel.calibrate.pairs import (
    MIN_KV_TOKENS,
    REFERENCE_GPU,
    REFERENCE_MODEL,
    REFERENCE_PROFILE,
    REFERENCE_TP,
    UTILIZATION,
    VidurPair,
    _sig,
    all_reduce_topology,
    calibrated_profile_name,
    choose_tp,
    load_all_reduce_rows,
    load_mlp,
    min_kv_tokens,
    vidur_pairs,
)
from sloserve.costmodel.calibrate.validation import (
    ValidationRow,
    _roofline_error_for,
    validate_roofline,
)
from sloserve.costmodel.fit.lstsq import FitError
from sloserve.costmodel.fit.vidur_profiles import SOURCE_COMMON, build_coefficients
from sloserve.costmodel.fit.vidur_tables import (
    ATTENTION_70B_TP2_CSV,
    MS,
    PER_LAYER_OPS,
    AllReduceFit,
    DecodeAttentionFit,
    NonAttentionFit,
    PrefillAttentionFit,
    fit_all_reduce,
    fit_non_attention,
)
from sloserve.costmodel.profile import DEFAULT_ACTIVATION_RESERVE_GIB, ReplicaProfile, kv_capacity
from sloserve.costmodel.roofline import DEFAULT_PARAMS, RooflineCostModel

HOLDOUT_NOTE = (
    "rows sorted by their inputs; every 5th (index % 5 == 4) held out; coefficients fitted "
    "on the rest by relative least squares; errors are |pred − measured| / measured on the "
    "held-out rows"
)
NOT_MODELLED = "LM head and sampling, KV-cache write and CPU overhead are not modelled"


# ---------------------------------------------------------------------------- reports


def _err(e: FitError) -> dict[str, float | int]:
    return e.as_dict()


def _non_attention_report(fit: NonAttentionFit, table: pd.DataFrame, data: str) -> dict[str, Any]:
    at = {
        int(t): _sig(float(v), 4)
        for t, v in zip(table["num_tokens"], table["layer_ms"], strict=True)
        if t in (1, 32, 512, 4096)
    }
    return {
        "data": data,
        "form": "max(floor, intercept + per_token·T), per iteration, ms",
        "floor_ms": _sig(fit.curve.floor),
        "intercept_ms": _sig(fit.curve.intercept),
        "per_token_ms": _sig(fit.curve.slope),
        "knee_tokens": _sig(fit.curve.knee, 4),
        "per_layer_ms_at": at,
        **_err(fit.error),
    }


def _decode_report(fit: DecodeAttentionFit) -> dict[str, Any]:
    return {
        "data": ATTENTION_70B_TP2_CSV,
        "form": "a + b·batch + c·batch·kv, per layer, ms (attn_decode + reshapes)",
        "a_ms": _sig(fit.intercept_ms),
        "b_ms": _sig(fit.per_seq_ms),
        "c_ms": _sig(fit.per_kv_ms),
        **_err(fit.error),
    }


def _prefill_report(fit: PrefillAttentionFit) -> dict[str, Any]:
    return {
        "data": ATTENTION_70B_TP2_CSV,
        "form": "a + w·c·(c + kv), per layer, ms (attn_prefill + reshapes)",
        "a_ms": _sig(fit.intercept_ms),
        "w_ms": _sig(fit.per_work_ms),
        **_err(fit.error),
    }


def _all_reduce_report(fit: AllReduceFit, data: str, n_ar: int) -> dict[str, Any]:
    return {
        "data": data,
        "form": f"a + b·bytes per all-reduce, ms; {n_ar} all-reduces of T·hidden·2 bytes",
        "a_ms": _sig(fit.intercept_ms),
        "b_ms_per_byte": _sig(fit.per_byte_ms),
        **_err(fit.error),
        "raw_points_in_range": _err(fit.raw_error),
        "raw_points_decode_sizes": _err(fit.decode_size_error),
    }


# ---------------------------------------------------------------------------- profiles


def calibrate_pair(
    vidur_dir: str | Path,
    pair: VidurPair,
    attention: AttentionCalibration,
    tp: int | None = None,
    validation: list[ValidationRow] | None = None,
) -> ReplicaProfile:
    """The calibrated profile of one pair (TP from :func:`choose_tp` unless given)."""
    root = Path(vidur_dir)
    model, gpu = pair.model, pair.gpu
    tp = choose_tp(model, gpu, pair.tps) if tp is None else tp
    name = calibrated_profile_name(pair.model_key, pair.gpu_dir, tp)
    L = model.num_layers
    table = load_mlp(root / pair.mlp_rel, tp, L)
    non_attn = fit_non_attention(table)
    mlp_data = f"{pair.mlp_rel} (num_tensor_parallel_workers == {tp})"

    is_ref = (pair.model_key, pair.gpu_dir, tp) == (REFERENCE_MODEL, REFERENCE_GPU, REFERENCE_TP)
    per_layer = attention.per_layer(model, gpu, tp)
    groups: dict[str, Any] = {"non_attention": _non_attention_report(non_attn, table, mlp_data)}
    dec, pre = _decode_report(attention.decode), _prefill_report(attention.prefill)
    if is_ref:
        groups["decode_attention"] = dec
        groups["prefill_attention"] = pre
        attention_text = f"Attention: {ATTENTION_70B_TP2_CSV} (Llama-2-70B TP2, FlashAttention)."
    else:
        scaling = (
            "roofline transfer of the reference fit: decode KV term × (KV bytes per token per "
            "layer per GPU ratio) × (HBM bandwidth ratio), decode per-request term × (query "
            "heads per GPU ratio) × (bandwidth ratio), prefill work term × (query heads per "
            "GPU ratio) × (peak FLOP/s ratio), intercepts kept"
        )
        groups["decode_attention"] = {"derived_from": REFERENCE_PROFILE, "scaling": scaling, **dec}
        groups["prefill_attention"] = {
            "derived_from": REFERENCE_PROFILE,
            "scaling": scaling,
            **pre,
        }
        kv_ratio = _kv_bytes_layer_gpu(model, tp) / _kv_bytes_layer_gpu(
            attention.ref_model, attention.ref_tp
        )
        attention_text = (
            "Attention is DERIVED, not measured for this model: from the Llama-2-70B TP2 "
            f"A100 attention fit ({ATTENTION_70B_TP2_CSV}), read as a roofline with "
            f"calibrated efficiencies (decode KV read at {attention.decode_bw_eff:.0%} of HBM "
            f"bandwidth, prefill at {attention.prefill_flops_eff:.0%} of peak on the "
            f"non-causal FLOP count) and transferred per layer to {model.num_heads // tp} "
            f"query heads per GPU, KV bytes per token per layer per GPU ×{kv_ratio:g} and "
            f"{gpu.name}'s bandwidth and peak, then × {L} layers."
        )

    derived: dict[str, Any] = {}
    n_ar = 2 * L + 1
    ar_bytes = model.hidden_size * model.dtype_bytes
    ar_fit: AllReduceFit | None = None
    comm_text = "No tensor parallelism, so no all-reduce."
    topo = all_reduce_topology(pair.gpu_dir, tp)
    if tp > 1 and topo is not None:
        path = root / "network" / topo / "all_reduce.csv"
        dpn = None if topo.endswith("pairwise_nvlink") else tp
        measured = load_all_reduce_rows(path, tp, dpn)
        top = float(measured["size"].max())
        grid = [int(t) for t in table["num_tokens"] if t * ar_bytes <= top]
        ar_fit = fit_all_reduce(measured, grid, ar_bytes, iteration=(n_ar, non_attn.curve))
        data = f"network/{topo}/all_reduce.csv (num_workers == {tp}"
        data += ")" if dpn is None else f", devices_per_node == {tp})"
        groups["all_reduce"] = _all_reduce_report(ar_fit, data, n_ar)
        comm_text = f"All-reduce: {data}, {n_ar} all-reduces of T·{model.hidden_size}·2 bytes."
    coeffs = build_coefficients(non_attn.curve, per_layer, L, ar_fit, ar_bytes)
    if tp > 1 and topo is None:
        rm = RooflineCostModel(model, gpu, tp, DEFAULT_PARAMS)
        lat = float(rm.all_reduce_once_time(0.0))
        per_tok = float(rm.all_reduce_once_time(ar_bytes)) - lat
        link = "NVLink bridge" if gpu.uses_nvlink(tp) else "PCIe"
        coeffs = coeffs.model_copy(
            update={"comm_intercept": _sig(n_ar * lat), "comm_per_token": _sig(n_ar * per_tok)}
        )
        derived["all_reduce"] = {
            "derived_from": "roofline (no all-reduce measurements for this GPU)",
            "link": f"{link}, {gpu.link_bytes_per_s(tp) / 1e9:g} GB/s per direction",
            "link_eff": DEFAULT_PARAMS.allreduce_link_eff if gpu.uses_nvlink(tp) else 1.0,
            "latency_ms": _sig(lat / MS),
            "form": f"{n_ar} × (latency + 2(tp−1)/tp·T·{ar_bytes} bytes / link)",
        }
        comm_text = (
            f"All-reduce is DERIVED (roofline; no {pair.gpu_dir} all-reduce data): ring over "
            f"{link}, {n_ar} all-reduces of T·{model.hidden_size}·2 bytes."
        )

    m_at = kv_capacity(model, gpu, tp, UTILIZATION, DEFAULT_ACTIVATION_RESERVE_GIB)
    report: dict[str, Any] = {
        "holdout": HOLDOUT_NOTE,
        "tp_choice": (
            f"smallest TP in the mlp.csv ({', '.join(map(str, pair.tps))}) with "
            f"M({UTILIZATION}) >= max(max_context, {MIN_KV_TOKENS}) = {min_kv_tokens(model)} "
            f"tokens: TP {tp}, M = {m_at}"
        ),
        "groups": groups,
        "attention_calibration": attention.report(),
        "attention_per_layer_ms": per_layer.as_dict(),
        "not_modelled": NOT_MODELLED,
    }
    if derived:
        report["derived_terms"] = derived
    if validation is not None:
        report["roofline_error"] = _roofline_error_for(validation, pair, tp)
    short = pair.model_dir.split("/")[-1]
    return ReplicaProfile(
        name=name,
        description=(
            f"{short} on one {gpu.name}, fp16/bf16"
            if tp == 1
            else f"{short}, tensor-parallel over {tp}× {gpu.name}, fp16/bf16"
        ),
        model=model,
        gpu=gpu,
        tp=tp,
        activation_reserve_gib=DEFAULT_ACTIVATION_RESERVE_GIB,
        coefficients=coeffs,
        source=(
            SOURCE_COMMON
            + f"Non-attention: {mlp_data}; {len(PER_LAYER_OPS)} per-layer operators × {L} "
            f"layers + emb once. {attention_text} {comm_text} intercept = 0: {NOT_MODELLED}."
        ),
        fit_report=report,
    )


def calibrate_all(vidur_dir: str | Path, with_validation: bool = True) -> dict[str, ReplicaProfile]:
    """The calibrated profile of every pair in ``vidur_dir``, by name."""
    attention = calibrate_attention(vidur_dir)
    validation = validate_roofline(vidur_dir) if with_validation else None
    out: dict[str, ReplicaProfile] = {}
    for pair in vidur_pairs(vidur_dir):
        p = calibrate_pair(vidur_dir, pair, attention, validation=validation)
        if p.name in out:
            raise ConfigError(f"two pairs map to the profile name {p.name}")
        out[p.name] = p
    return dict(sorted(out.items()))
