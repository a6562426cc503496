"""Attention measured once (Llama-2-70B TP2 on A100), transferred by the roofline.

Attention: measured once, transferred by the roofline
    Attention is measured only for Llama-2-70B TP2 on A100. Its fits
    (:func:`vidur_tables.fit_decode_attention`, :func:`vidur_tables.fit_prefill_attention`,
    per layer) are read as a roofline whose efficiency factors they calibrate
    (:class:`AttentionCalibration`):

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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel import catalog
from sloserve.costmodel.calibrate.pairs import (
    REFERENCE_GPU,
    REFERENCE_MODEL,
    REFERENCE_TP,
    VIDUR_GPUS,
    _attention_tables,
    _sig,
)
from sloserve.costmodel.fit.vidur_profiles import AttentionPerLayer
from sloserve.costmodel.fit.vidur_tables import (
    ATTENTION_70B_TP2_CSV,
    MS,
    DecodeAttentionFit,
    PrefillAttentionFit,
    fit_decode_attention,
    fit_prefill_attention,
)
from sloserve.costmodel.roofline import DEFAULT_PARAMS, RooflineParams


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
