"""Calibrated profiles for every model/GPU pair in Vidur's profiling data, and the roofline
model's validation against all of Vidur's measurements.

The data are the Vidur project's public operator timings (microsoft/vidur, MIT licence),
read from ``shared/vidur-profiling`` (never copied into the repository);
``scripts/fit_vidur_profiles.py`` runs :func:`calibrate_all` and writes one YAML profile per
pair into ``costmodel/profiles/``. The fitting itself is :mod:`sloserve.costmodel.fit`'s
(relative least squares, every 5th point held out); this module decides what to fit for
which pair.

Pairs, TP and names
    Every ``compute/<gpu>/<org>/<model>/mlp.csv`` is one pair (GPUs ``a100`` = A100-80GB,
    ``h100`` = H100-80GB SXM, ``a40``; models resolved in the catalog by their Hugging Face
    id). The TP degree is the smallest one the ``mlp.csv`` has rows for whose weights fit
    with room for KV: ``M(0.9) ≥ max(max_context, 16384)`` tokens — one request of the
    model's full context and a batch's worth (16 × 1,024) of ordinary ones; the 1 GiB per-GPU
    activation reserve of every profile is included. Names are ``<model>-<gpu>`` plus
    ``x<tp>`` when ``tp > 1`` (``llama-2-7b-a100``, ``qwen-72b-a100x4``), the two original
    built-in names included.

Non-attention
    Fitted per pair from its ``mlp.csv`` rows at the chosen TP (:func:`fit.fit_non_attention`:
    ``max(floor, intercept + per_token·T)``, held-out error reported). phi-2's parallel block
    has no ``post_attention_layernorm`` column; absent per-layer operators count as 0 (fit.py's
    loader requires all nine, so phi-2 uses :func:`load_mlp`'s own equivalent).

Attention: measured once, transferred by the roofline
    Attention is measured only for Llama-2-70B TP2 on A100. Its fits
    (:func:`fit.fit_decode_attention`, :func:`fit.fit_prefill_attention`, per layer) are read
    as a roofline whose efficiency factors they calibrate (:class:`AttentionCalibration`):

    * decode KV term ``c`` (ms per KV token): bandwidth-bound, so the achieved fraction of
      HBM bandwidth is ``η_dec = KV bytes per token per layer per GPU / (bandwidth × c)``;
      another model/GPU/TP gets ``c' = its KV bytes / (its bandwidth × η_dec)``;
    * decode per-request term ``b`` (query load, output write): scaled by the query heads per
      GPU and the bandwidth in the same way;
    * prefill work term ``w`` (ms per unit of ``c·(c+ctx)``): compute-bound,
      ``η_pre = 4·q_heads_per_GPU·head_dim / (peak × w)``, transferred through the peak
      FLOP/s of the target GPU;
    * the intercepts (kernel launch and fixed work) are kept as measured on every GPU.

    On the A100 this is exactly the scaling the original Llama-2-7B profile used (KV-bytes
    ratio for the KV term, FLOP ratio for the prefill term), so that profile is unchanged.
    The reported held-out errors of derived attention groups are the reference fit's, marked
    ``derived_from``: there are no measurements to check the transfer against.

All-reduce
    Fitted (:func:`fit.fit_all_reduce`, at the message sizes the pair's token grid produces)
    on the topology a replica of that TP would run on: TP2 on ``<gpu>_pairwise_nvlink``
    (two NVLink-joined GPUs, as the original 70B profile), TP4/8 on ``<gpu>_dgx`` rows with
    ``devices_per_node == num_workers`` (one NVSwitch node; the ``a100_dgx`` file mixes in
    cross-node rows with fewer devices per node, which fit.py's loader would merge). Sizes
    beyond the largest measured message are left out of the fit (the line extrapolates).
    There is no A40 all-reduce data: A40 profiles use the roofline all-reduce (NVLink bridge
    for TP2, PCIe beyond; default link efficiency and latency), listed under
    ``fit_report.derived_terms``.

Roofline validation (:func:`validate_roofline`)
    The uncalibrated roofline (default :class:`RooflineParams`) against every measurement:
    non-attention per model/GPU/TP (every TP in every ``mlp.csv``, without the LM head,
    which Vidur does not time), decode and prefill attention (70B TP2 A100), and all-reduce
    per topology and worker count, grouped by the link the ring crosses: ``nvlink`` (one
    NVLink domain: a pair on ``*_pairwise_nvlink``, a whole ``*_dgx`` node), ``pcie``
    (``*_pairwise_nvlink`` with 4 workers) and ``cross_node`` (``*_dgx`` with fewer devices
    per node than workers; the roofline stands the GPU's PCIe rate in for the network —
    sloserve's replicas are single-node, so this group is reported, not relied on). The A100
    rows are compared with the A100-80GB SXM spec although Vidur's A100 nodes may be PCIe
    cards (5% less bandwidth).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel import catalog
from sloserve.costmodel.fit import (
    ATTENTION_70B_TP2_CSV,
    MS,
    PER_ITERATION_OPS,
    PER_LAYER_OPS,
    SOURCE_COMMON,
    AllReduceFit,
    AttentionPerLayer,
    DecodeAttentionFit,
    FitError,
    NonAttentionFit,
    PrefillAttentionFit,
    build_coefficients,
    fit_all_reduce,
    fit_decode_attention,
    fit_non_attention,
    fit_prefill_attention,
    load_attention_tables,
    load_mlp_table,
)
from sloserve.costmodel.profile import DEFAULT_ACTIVATION_RESERVE_GIB, ReplicaProfile, kv_capacity
from sloserve.costmodel.roofline import DEFAULT_PARAMS, RooflineCostModel, RooflineParams

VIDUR_GPUS: dict[str, str] = {"a100": "a100-80gb", "h100": "h100-80gb", "a40": "a40"}
"""Vidur's GPU directory names → catalog GPU keys."""

REFERENCE_MODEL = "llama-2-70b"
REFERENCE_GPU = "a100"
REFERENCE_TP = 2
REFERENCE_PROFILE = "llama-2-70b-a100x2"
"""The only pair with measured attention."""

MIN_KV_TOKENS = 16384
"""Room for KV a TP must leave: at least this many tokens (and the model's max context)."""

UTILIZATION = 0.9
"""GPU memory utilisation at which the TP choice checks the KV room."""

HOLDOUT_NOTE = (
    "rows sorted by their inputs; every 5th (index % 5 == 4) held out; coefficients fitted "
    "on the rest by relative least squares; errors are |pred − measured| / measured on the "
    "held-out rows"
)
NOT_MODELLED = "LM head and sampling, KV-cache write and CPU overhead are not modelled"


def _sig(v: float, sig: int = 6) -> float:
    return float(f"{v:.{sig}g}")


# ---------------------------------------------------------------------------- pairs and TP


@dataclass(frozen=True)
class VidurPair:
    """One ``compute/<gpu>/<org>/<model>/mlp.csv`` of Vidur's data."""

    gpu_dir: str
    model_dir: str
    model_key: str
    gpu_key: str
    mlp_rel: str
    tps: tuple[int, ...]

    @property
    def model(self) -> ModelSpec:
        """The catalog spec of the pair's model."""
        return catalog.model_spec(self.model_key)

    @property
    def gpu(self) -> GPUSpec:
        """The catalog spec of the pair's GPU."""
        return catalog.gpu_spec(self.gpu_key)


@cache
def _read_csv(path: str) -> pd.DataFrame:
    return pd.read_csv(path)


def vidur_pairs(vidur_dir: str | Path) -> list[VidurPair]:
    """Every model/GPU pair with an ``mlp.csv`` under ``vidur_dir/compute``."""
    root = Path(vidur_dir)
    out = []
    for path in sorted(root.glob("compute/*/*/*/mlp.csv")):
        gpu_dir, org, model = path.parts[-4], path.parts[-3], path.parts[-2]
        if gpu_dir not in VIDUR_GPUS:
            raise ConfigError(f"{path}: unknown Vidur GPU directory {gpu_dir!r}")
        tps = tuple(
            sorted(int(t) for t in _read_csv(str(path))["num_tensor_parallel_workers"].unique())
        )
        out.append(
            VidurPair(
                gpu_dir=gpu_dir,
                model_dir=f"{org}/{model}",
                model_key=catalog.model_key(f"{org}/{model}"),
                gpu_key=VIDUR_GPUS[gpu_dir],
                mlp_rel=str(path.relative_to(root)),
                tps=tps,
            )
        )
    return out


def min_kv_tokens(model: ModelSpec) -> int:
    """The KV room a TP choice must leave (see the module docstring)."""
    return max(model.max_context, MIN_KV_TOKENS)


def choose_tp(
    model: ModelSpec,
    gpu: GPUSpec,
    tps: Iterable[int],
    utilization: float = UTILIZATION,
    min_tokens: int | None = None,
) -> int:
    """The smallest TP in ``tps`` with ``M(utilization) ≥ min_tokens`` (default
    :func:`min_kv_tokens`)."""
    need = min_kv_tokens(model) if min_tokens is None else min_tokens
    for tp in sorted(tps):
        if model.num_heads % tp:
            continue
        if kv_capacity(model, gpu, tp, utilization, DEFAULT_ACTIVATION_RESERVE_GIB) >= need:
            return tp
    raise ConfigError(
        f"{model.name} on {gpu.name}: no TP in {sorted(tps)} leaves {need} tokens of KV"
    )


def calibrated_profile_name(model_key: str, gpu_dir: str, tp: int) -> str:
    """``<model>-<gpu>`` plus ``x<tp>`` when ``tp > 1``."""
    return f"{model_key}-{gpu_dir}" + (f"x{tp}" if tp > 1 else "")


# ---------------------------------------------------------------------------- loaders


def load_mlp(path: str | Path, tp: int, num_layers: int) -> pd.DataFrame:
    """:func:`fit.load_mlp_table`, tolerating absent per-layer operators (counted as 0).

    Same columns (``num_tokens``, ``layer_ms``, ``emb_ms``, ``iteration_ms``).
    """
    df = _read_csv(str(path))
    ops = {c.split(".")[1] for c in df.columns if c.startswith("time_stats.")}
    unknown = ops - set(PER_LAYER_OPS) - set(PER_ITERATION_OPS)
    if unknown:
        raise ValueError(f"{path}: unclassified operators {sorted(unknown)}")
    if set(PER_LAYER_OPS) <= ops:
        return load_mlp_table(path, tp, num_layers)
    rows = df[df["num_tensor_parallel_workers"] == tp]
    if rows.empty:
        raise ValueError(f"{path}: no rows with num_tensor_parallel_workers == {tp}")
    layer = [f"time_stats.{o}.median" for o in PER_LAYER_OPS if o in ops]
    per_iter = [f"time_stats.{o}.median" for o in PER_ITERATION_OPS if o in ops]
    out = pd.DataFrame(
        {
            "num_tokens": rows["num_tokens"].astype(np.int64),
            "layer_ms": rows[layer].sum(axis=1),
            "emb_ms": rows[per_iter].sum(axis=1),
        }
    )
    out = out.groupby("num_tokens", as_index=False).median().sort_values("num_tokens")
    out["iteration_ms"] = num_layers * out["layer_ms"] + out["emb_ms"]
    return out.reset_index(drop=True)


def all_reduce_topology(gpu_dir: str, tp: int) -> str | None:
    """The ``network/<topology>`` a TP replica on ``gpu_dir`` runs on (None: no data)."""
    if gpu_dir not in ("a100", "h100") or tp < 2:
        return None
    return f"{gpu_dir}_pairwise_nvlink" if tp == 2 else f"{gpu_dir}_dgx"


def load_all_reduce_rows(
    path: str | Path, num_workers: int, devices_per_node: int | None = None
) -> pd.DataFrame:
    """Median all-reduce time (ms) vs ``size`` for ``num_workers`` GPUs, optionally only the
    rows with ``devices_per_node`` GPUs per node (fit.py's loader does not filter on it)."""
    df = _read_csv(str(path))
    rows = df[df["num_workers"] == num_workers]
    if devices_per_node is not None:
        rows = rows[rows["devices_per_node"] == devices_per_node]
    if rows.empty:
        raise ValueError(f"{path}: no rows with num_workers == {num_workers}")
    out = pd.DataFrame(
        {"size": rows["size"].astype(np.int64), "time_ms": rows["time_stats.all_reduce.median"]}
    )
    return out.groupby("size", as_index=False).median().sort_values("size").reset_index(drop=True)


# ---------------------------------------------------------------------------- attention


def _query_width(model: ModelSpec, tp: int) -> float:
    return model.num_heads * model.head_dim / tp


def _kv_bytes_layer_gpu(model: ModelSpec, tp: int) -> float:
    return 2.0 * model.kv_heads_per_gpu(tp) * model.head_dim * model.dtype_bytes


@dataclass(frozen=True)
class AttentionCalibration:
    """Roofline attention efficiencies calibrated on the reference measurements."""

    decode: DecodeAttentionFit
    prefill: PrefillAttentionFit
    ref_model: ModelSpec
    ref_gpu: GPUSpec
    ref_tp: int

    @property
    def decode_bw_eff(self) -> float:
        """Achieved fraction of HBM bandwidth of the decode KV read."""
        kv = _kv_bytes_layer_gpu(self.ref_model, self.ref_tp)
        return kv / (self.ref_gpu.hbm_bytes_per_s * self.decode.per_kv_ms * MS)

    @property
    def prefill_flops_eff(self) -> float:
        """Achieved fraction of peak of prefill attention (non-causal FLOP count)."""
        flops = 4 * _query_width(self.ref_model, self.ref_tp)
        peak = self.ref_gpu.peak_tflops(self.ref_model.dtype_bytes) * 1e12
        return flops / (peak * self.prefill.per_work_ms * MS)

    def per_layer(self, model: ModelSpec, gpu: GPUSpec, tp: int) -> AttentionPerLayer:
        """Per-layer attention coefficients (ms) for ``model`` on ``gpu`` at ``tp``."""
        bw = self.ref_gpu.hbm_bytes_per_s / gpu.hbm_bytes_per_s
        peak = self.ref_gpu.peak_tflops(self.ref_model.dtype_bytes) / gpu.peak_tflops(
            model.dtype_bytes
        )
        kv = _kv_bytes_layer_gpu(model, tp) / _kv_bytes_layer_gpu(self.ref_model, self.ref_tp)
        q = _query_width(model, tp) / _query_width(self.ref_model, self.ref_tp)
        return AttentionPerLayer(
            decode_intercept_ms=self.decode.intercept_ms,
            decode_per_seq_ms=self.decode.per_seq_ms * q * bw,
            decode_per_kv_ms=self.decode.per_kv_ms * kv * bw,
            prefill_intercept_ms=self.prefill.intercept_ms,
            prefill_per_work_ms=self.prefill.per_work_ms * q * peak,
        )

    def roofline_params(self, base: RooflineParams = DEFAULT_PARAMS) -> RooflineParams:
        """``base`` with its attention efficiencies and latencies replaced by the calibrated
        ones."""
        return base.model_copy(
            update={
                "attn_decode_bw_eff": min(1.0, self.decode_bw_eff),
                "attn_decode_latency_s": self.decode.intercept_ms * MS,
                "attn_prefill_flops_eff": min(1.0, self.prefill_flops_eff),
                "attn_prefill_latency_s": self.prefill.intercept_ms * MS,
            }
        )

    def report(self) -> dict[str, float]:
        """The calibrated efficiencies, for fit reports."""
        return {
            "decode_bw_eff": _sig(self.decode_bw_eff, 4),
            "prefill_flops_eff_noncausal": _sig(self.prefill_flops_eff, 4),
            "decode_latency_ms": _sig(self.decode.intercept_ms, 4),
            "prefill_latency_ms": _sig(self.prefill.intercept_ms, 4),
        }


@cache
def _attention_tables(path: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    return load_attention_tables(path)


def calibrate_attention(vidur_dir: str | Path) -> AttentionCalibration:
    """Fit the reference (Llama-2-70B TP2 A100) attention and read it as efficiencies."""
    decode, prefill = _attention_tables(str(Path(vidur_dir) / ATTENTION_70B_TP2_CSV))
    return AttentionCalibration(
        decode=fit_decode_attention(decode),
        prefill=fit_prefill_attention(prefill),
        ref_model=catalog.model_spec(REFERENCE_MODEL),
        ref_gpu=catalog.gpu_spec(VIDUR_GPUS[REFERENCE_GPU]),
        ref_tp=REFERENCE_TP,
    )


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
        ar_fit = fit_all_reduce(measured, grid, ar_bytes)
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


# ---------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class ValidationRow:
    """The roofline's error on one set of measurements."""

    group: str
    config: str
    n: int
    median_rel_err: float
    p90_rel_err: float
    signed_median: float
    """Median of (pred − measured)/measured: > 0 means the roofline is slow."""
    rel_errors: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The row's numbers (without the per-point errors), rounded, for reports."""
        return {
            "n": self.n,
            "median_rel_err": _sig(self.median_rel_err, 4),
            "p90_rel_err": _sig(self.p90_rel_err, 4),
            "signed_median": _sig(self.signed_median, 4),
        }


def _row(group: str, config: str, pred: Any, meas: Any) -> ValidationRow:
    p = np.asarray(pred, dtype=np.float64)
    m = np.asarray(meas, dtype=np.float64)
    signed = (p - m) / m
    rel = np.abs(signed)
    return ValidationRow(
        group=group,
        config=config,
        n=int(m.size),
        median_rel_err=float(np.median(rel)),
        p90_rel_err=float(np.quantile(rel, 0.9)),
        signed_median=float(np.median(signed)),
        rel_errors=tuple(float(x) for x in rel),
    )


def _config(model_key: str, gpu_dir: str, tp: int) -> str:
    return f"{model_key} {gpu_dir} tp{tp}"


def validate_roofline(
    vidur_dir: str | Path, params: RooflineParams = DEFAULT_PARAMS
) -> list[ValidationRow]:
    """The roofline (``params``) against every Vidur measurement, one row per configuration
    (see the module docstring for the groups)."""
    root = Path(vidur_dir)
    p_na = params.model_copy(update={"include_lm_head": False})
    rows: list[ValidationRow] = []
    for pair in vidur_pairs(root):
        for tp in pair.tps:
            if pair.model.num_heads % tp:
                continue
            table = load_mlp(root / pair.mlp_rel, tp, pair.model.num_layers)
            rm = RooflineCostModel(pair.model, pair.gpu, tp, p_na)
            pred = rm.non_attention_time(table["num_tokens"].to_numpy())
            meas = table["iteration_ms"].to_numpy() * MS
            rows.append(
                _row("non_attention", _config(pair.model_key, pair.gpu_dir, tp), pred, meas)
            )

    ref = RooflineCostModel(
        catalog.model_spec(REFERENCE_MODEL),
        catalog.gpu_spec(VIDUR_GPUS[REFERENCE_GPU]),
        REFERENCE_TP,
        p_na,
    )
    decode, prefill = _attention_tables(str(root / ATTENTION_70B_TP2_CSV))
    ref_cfg = _config(REFERENCE_MODEL, REFERENCE_GPU, REFERENCE_TP)
    b = decode["batch_size"].to_numpy(dtype=np.float64)
    pred = ref.decode_attention_layer_time(b, b * decode["kv_cache_size"].to_numpy())
    rows.append(_row("decode_attention", ref_cfg, pred, decode["time_ms"].to_numpy() * MS))
    c = prefill["prefill_chunk_size"].to_numpy(dtype=np.float64)
    pred = ref.prefill_attention_layer_time(c, c * (c + prefill["kv_cache_size"].to_numpy()))
    rows.append(_row("prefill_attention", ref_cfg, pred, prefill["time_ms"].to_numpy() * MS))

    for path in sorted(root.glob("network/*/all_reduce.csv")):
        topo = path.parts[-2]
        gpu_dir = topo.split("_")[0]
        if gpu_dir not in VIDUR_GPUS:
            continue
        df = _read_csv(str(path))
        configs = df[["num_workers", "devices_per_node"]].drop_duplicates()
        for nw, dpn in sorted((int(a), int(b)) for a, b in configs.itertuples(index=False)):
            domain = 2 if topo.endswith("pairwise_nvlink") else dpn
            gpu = catalog.gpu_spec(VIDUR_GPUS[gpu_dir]).model_copy(update={"nvlink_gpus": domain})
            rm = RooflineCostModel(ref.model, gpu, 1, params)
            measured = load_all_reduce_rows(path, nw, dpn)
            pred = rm.all_reduce_once_time(measured["size"].to_numpy(), workers=nw)
            if dpn < nw:
                group = "all_reduce_cross_node"
            elif gpu.uses_nvlink(nw):
                group = "all_reduce_nvlink"
            else:
                group = "all_reduce_pcie"
            cfg = f"{topo} workers={nw} per_node={dpn}"
            rows.append(_row(group, cfg, pred, measured["time_ms"].to_numpy() * MS))
    return rows


GROUPS: tuple[str, ...] = (
    "non_attention",
    "decode_attention",
    "prefill_attention",
    "all_reduce_nvlink",
    "all_reduce_pcie",
    "all_reduce_cross_node",
)


def group_summary(rows: Iterable[ValidationRow]) -> dict[str, dict[str, Any]]:
    """Per group: configurations, points, and the median / p90 relative error over all its
    points pooled, and the worst configuration's median."""
    by: dict[str, list[ValidationRow]] = {}
    for r in rows:
        by.setdefault(r.group, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for g in sorted(by, key=lambda g: GROUPS.index(g) if g in GROUPS else len(GROUPS)):
        rs = by[g]
        pooled = np.concatenate([np.asarray(r.rel_errors) for r in rs])
        worst = max(rs, key=lambda r: r.median_rel_err)
        out[g] = {
            "configs": len(rs),
            "n": int(pooled.size),
            "median_rel_err": _sig(float(np.median(pooled)), 4),
            "p90_rel_err": _sig(float(np.quantile(pooled, 0.9)), 4),
            "worst_config": worst.config,
            "worst_config_median_rel_err": _sig(worst.median_rel_err, 4),
        }
    return out


def format_table(rows: Iterable[ValidationRow]) -> str:
    """The validation rows and group summaries as a fixed-width text table."""
    rows = list(rows)
    lines = [
        f"{'group':<22} {'configuration':<42} {'n':>6} {'median':>7} {'p90':>7} {'signed':>7}",
    ]
    for r in rows:
        lines.append(
            f"{r.group:<22} {r.config:<42} {r.n:>6} {r.median_rel_err:>7.1%} "
            f"{r.p90_rel_err:>7.1%} {r.signed_median:>+7.1%}"
        )
    lines.append("")
    lines.append(
        f"{'group (all points pooled)':<30} {'configs':>7} {'n':>7} {'median':>7} {'p90':>7}"
    )
    for g, s in group_summary(rows).items():
        lines.append(
            f"{g:<30} {s['configs']:>7} {s['n']:>7} {s['median_rel_err']:>7.1%} "
            f"{s['p90_rel_err']:>7.1%}"
        )
    return "\n".join(lines)


def _roofline_error_for(rows: list[ValidationRow], pair: VidurPair, tp: int) -> dict[str, Any]:
    """The validation rows that concern one calibrated profile."""
    cfg = _config(pair.model_key, pair.gpu_dir, tp)
    out: dict[str, Any] = {
        "params": "default RooflineParams, without the LM head (Vidur does not time it)",
    }
    for r in rows:
        if r.config == cfg:
            out[r.group] = r.as_dict()
    topo = all_reduce_topology(pair.gpu_dir, tp)
    if topo is not None:
        want = f"{topo} workers={tp} per_node={tp}"
        for r in rows:
            if r.config == want:
                out[r.group] = {"data": want, **r.as_dict()}
    return out
