"""The roofline batch-time model: iteration time from a ModelSpec, a GPUSpec and the TP degree.

Every operator (group) of an iteration costs ``max(compute time, memory time)`` plus a fixed
kernel latency, where compute time is FLOPs over ``peak × flops efficiency`` and memory time
is bytes over ``bandwidth × bandwidth efficiency``; the groups run one after another, so
their times add. Everything is per GPU: with tensor parallelism ``tp`` every GPU holds
``1/tp`` of each weight matrix, ``1/tp`` of the query heads and ``max(1, kv_heads/tp)`` KV
heads (replicated when ``tp`` exceeds the KV heads, as vLLM does).

Operator groups (per iteration of ``T`` tokens; ``L`` layers, hidden size ``h``):

Non-attention, per layer
    Four GEMMs: QKV projection, output projection, MLP up (gate+up when gated) and MLP down.
    Each reads its weights once per iteration (``k·n`` elements) plus its activations
    (``T·(k+n)``) and does ``2·T·k·n`` FLOPs. MoE layers: each token runs
    ``experts_per_token`` experts; an iteration reads the weights of the experts its tokens
    touch, on average ``E·(1 − (1 − k/E)^T)`` of the ``E`` (tokens routed uniformly at
    random), plus a router GEMM. Five memory-bound elementwise kernels (two RMS/layer norms,
    rotary embedding, activation, residual add) move ``7h + 2(q+kv heads)·d + 3·I`` (2·I for
    a non-gated MLP) elements per token. Once per iteration: the token-embedding gather.
    These are the operators Vidur's ``mlp.csv`` times (9 per layer + ``emb``).
Attention, per layer
    Decode (FlashAttention/paged decode): reads the KV cache of every decode request — the
    bytes of ``Σ context`` tokens — plus each request's query, output and new K/V; FLOPs
    ``4·q_heads·d·Σ context``. Prefill: FLOPs ``4·q_heads·d·W`` with
    ``W = BatchStats.prefill_attn_work = Σ c·(c + cached context)`` (quadratic in the chunk);
    bytes are the chunk's Q, O, K, V. The aggregates in :class:`BatchStats` do not tell the
    causal half of ``c²`` apart from ``c·ctx``, so the FLOPs are counted without the causal
    saving and the efficiency absorbs it (a kernel skipping masked blocks shows an
    "efficiency" up to 2× its real MFU). The KV read of the cached context during a chunked
    prefill is not in the aggregates either and is left out (prefill is compute bound).
LM head
    One GEMM ``h → vocab/tp`` for the sampled rows only (one per decode request and per
    prefill sequence); vLLM computes logits only where it samples. Vidur does not time it;
    ``include_lm_head=False`` leaves it out.
Tensor-parallel all-reduce
    Megatron-style TP does two all-reduces of ``T·h·dtype`` bytes per layer, plus one for the
    vocabulary-parallel embedding: ``2L + 1`` per iteration. A ring all-reduce over ``tp``
    GPUs moves ``2(tp−1)/tp × bytes`` per GPU over the link: NVLink (data-sheet per-direction
    rate × ``allreduce_link_eff``) when the replica fits in one NVLink domain, else the GPU's
    effective PCIe rate (already an achieved rate, no further efficiency). Each all-reduce
    also costs ``allreduce_latency_s``.
Per-iteration overhead
    ``iteration_overhead_s`` (CPU scheduling, input preparation, sampling). Default 0, like
    the Vidur-fitted profiles, so the two kinds of profile are comparable; vLLM's is a few ms
    without CUDA graphs.

Efficiency defaults
    The efficiency factors and latencies below are round numbers in the range published for
    these kernels (cuBLAS GEMMs reach 70–80% of the dense tensor peak on large shapes;
    bandwidth-bound kernels 75–90% of HBM bandwidth; a few µs per kernel launch; NCCL
    all-reduce on NVLink reaches 50–80% of the link rate) and were then checked against
    Vidur's measurements (``sloserve.costmodel.calibrate.validate_roofline``; the per-group
    error table is in the calibration test's output and the calibrated profiles' fit
    reports). The attention defaults are close to what the Llama-2-70B TP2 A100 measurements
    give (``calibrate.calibrate_attention``: 77% of bandwidth, 37% of peak). They are one
    set for every GPU. Against all of Vidur's data (when these defaults were set) the median
    relative error is 4.7% for non-attention over 71 model/GPU/TP configurations (the worst
    configuration 10%: the A40, whose GEMMs reach less of their peak), 10.5% for decode
    attention, 8.8% for prefill attention and 15% for NVLink all-reduces; the calibrated
    profiles, fitted per pair, are closer still (a few %).

Linearisation
    :func:`linear_coefficients` turns a roofline model into :class:`LinearCoefficients`, which
    is how :func:`sloserve.costmodel.profile.profile_from_specs` builds a profile for any
    catalog model and GPU (see there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.costmodel.linear import LinearCoefficients

FloatArray = NDArray[np.float64]


class RooflineParams(BaseModel):
    """Achievable fractions of peak and fixed latencies of the roofline model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gemm_flops_eff: float = Field(
        default=0.7, gt=0, le=1, description="fraction of dense tensor peak a GEMM reaches"
    )
    gemm_bw_eff: float = Field(
        default=0.8, gt=0, le=1, description="fraction of HBM bandwidth a weight read reaches"
    )
    elementwise_bw_eff: float = Field(
        default=0.7, gt=0, le=1, description="fraction of HBM bandwidth of norms, rope, add"
    )
    kernel_latency_s: float = Field(
        default=5e-6, ge=0, description="fixed cost of every non-attention kernel launch"
    )
    attn_decode_bw_eff: float = Field(
        default=0.7, gt=0, le=1, description="fraction of HBM bandwidth a decode KV read reaches"
    )
    attn_decode_latency_s: float = Field(
        default=15e-6, ge=0, description="per layer, once if any decode request"
    )
    attn_prefill_flops_eff: float = Field(
        default=0.35,
        gt=0,
        le=1,
        description="fraction of peak prefill attention reaches on the non-causal FLOP count",
    )
    attn_prefill_latency_s: float = Field(
        default=25e-6, ge=0, description="per layer, once if any prefill"
    )
    allreduce_link_eff: float = Field(
        default=0.6, gt=0, le=1, description="fraction of the NVLink rate a ring all-reduce gets"
    )
    allreduce_latency_s: float = Field(
        default=30e-6, ge=0, description="fixed cost of one all-reduce"
    )
    iteration_overhead_s: float = Field(
        default=0.0, ge=0, description="CPU-side cost of every non-empty iteration"
    )
    include_lm_head: bool = Field(default=True, description="time the LM head GEMM")
    swap_latency_s: float = Field(default=0.0, ge=0, description="fixed cost of one swap")


DEFAULT_PARAMS = RooflineParams()


@dataclass(frozen=True)
class _Shapes:
    """Per-GPU shapes at one TP degree (elements, not bytes)."""

    h: int
    d: int
    q_heads: float
    kv_heads: float
    inter: float
    up_mult: int
    vocab: float


class RooflineCostModel(CostModel):
    """Analytical per-iteration time of one replica (``tp`` GPUs) from public specs."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        tp: int = 1,
        params: RooflineParams = DEFAULT_PARAMS,
        *,
        name: str | None = None,
    ) -> None:
        if tp < 1:
            raise ValueError("tp must be >= 1")
        if model.num_heads % tp:
            raise ValueError(f"{model.name}: {model.num_heads} heads do not split over TP {tp}")
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.params = params
        self.name = name or f"roofline:{model.name}@{gpu.name}x{tp}"
        self.flops = gpu.peak_tflops(model.dtype_bytes) * 1e12
        self.bw = gpu.hbm_bytes_per_s
        self.b = model.dtype_bytes
        self.s = _Shapes(
            h=model.hidden_size,
            d=model.head_dim,
            q_heads=model.num_heads / tp,
            kv_heads=float(model.kv_heads_per_gpu(tp)),
            inter=model.intermediate_size / tp,
            up_mult=2 if model.gated_mlp else 1,
            vocab=model.vocab_size / tp,
        )

    # ------------------------------------------------------------------ primitives

    def _gemm(self, tokens: Any, k: float, n: float, weights_read: Any = None) -> Any:
        """One GEMM of ``tokens × k`` by ``k × n``: max(compute, memory) + launch latency."""
        p = self.params
        t = np.asarray(tokens, dtype=np.float64)
        w = k * n if weights_read is None else weights_read
        compute = 2.0 * t * k * n / (self.flops * p.gemm_flops_eff)
        memory = (w + t * (k + n)) * self.b / (self.bw * p.gemm_bw_eff)
        return np.maximum(compute, memory) + p.kernel_latency_s

    # ------------------------------------------------------------------ operator groups

    def layer_non_attention_time(self, tokens: Any) -> Any:
        """Seconds of one layer's non-attention operators for ``tokens`` tokens (per GPU)."""
        m, s, p = self.model, self.s, self.params
        t = np.asarray(tokens, dtype=np.float64)
        qkv = self._gemm(t, s.h, (s.q_heads + 2 * s.kv_heads) * s.d)
        out = self._gemm(t, s.q_heads * s.d, s.h)
        if m.is_moe:
            e, k = m.num_experts, m.experts_per_token
            touched = e * (1.0 - (1.0 - k / e) ** t)
            routed = t * k
            up = self._gemm(routed, s.h, s.up_mult * s.inter, touched * s.h * s.up_mult * s.inter)
            down = self._gemm(routed, s.inter, s.h, touched * s.inter * s.h)
            mlp = up + down + self._gemm(t, s.h, e)
            act_width = k * s.inter
        else:
            mlp = self._gemm(t, s.h, s.up_mult * s.inter) + self._gemm(t, s.inter, s.h)
            act_width = s.inter
        elem_per_token = 7 * s.h + 2 * (s.q_heads + s.kv_heads) * s.d + (s.up_mult + 1) * act_width
        elementwise = t * elem_per_token * self.b / (self.bw * p.elementwise_bw_eff)
        return qkv + out + mlp + elementwise + 5 * p.kernel_latency_s

    def embedding_time(self, tokens: Any) -> Any:
        """Seconds of the token-embedding gather (read and write ``h`` per token)."""
        p = self.params
        t = np.asarray(tokens, dtype=np.float64)
        return 2 * t * self.s.h * self.b / (self.bw * p.elementwise_bw_eff) + p.kernel_latency_s

    def non_attention_time(self, tokens: Any) -> Any:
        """Seconds of all layers' non-attention operators plus the embedding (Vidur's
        ``mlp.csv`` operators), without the LM head and all-reduces."""
        return self.model.num_layers * self.layer_non_attention_time(tokens) + (
            self.embedding_time(tokens)
        )

    def lm_head_time(self, num_seqs: Any) -> Any:
        """Seconds of the LM head for ``num_seqs`` sampled rows (0 when disabled or none)."""
        n = np.asarray(num_seqs, dtype=np.float64)
        if not self.params.include_lm_head or self.s.vocab == 0:
            return n * 0.0
        return np.where(n > 0, self._gemm(n, self.s.h, self.s.vocab), 0.0)

    def decode_attention_layer_time(self, num_decode: Any, context_sum: Any) -> Any:
        """Seconds of one layer's decode attention (per GPU)."""
        s, p = self.s, self.params
        nd = np.asarray(num_decode, dtype=np.float64)
        ctx = np.asarray(context_sum, dtype=np.float64)
        kv_bytes = 2 * s.kv_heads * s.d * self.b
        seq_bytes = (2 * s.q_heads + 2 * s.kv_heads) * s.d * self.b
        memory = (ctx * kv_bytes + nd * seq_bytes) / (self.bw * p.attn_decode_bw_eff)
        compute = 4 * s.q_heads * s.d * ctx / (self.flops * p.gemm_flops_eff)
        return np.where(nd > 0, np.maximum(memory, compute) + p.attn_decode_latency_s, 0.0)

    def prefill_attention_layer_time(self, num_tokens: Any, work: Any) -> Any:
        """Seconds of one layer's prefill attention for ``num_tokens`` chunk tokens and
        ``work = Σ c·(c + ctx)`` (per GPU)."""
        s, p = self.s, self.params
        t = np.asarray(num_tokens, dtype=np.float64)
        w = np.asarray(work, dtype=np.float64)
        compute = 4 * s.q_heads * s.d * w / (self.flops * p.attn_prefill_flops_eff)
        memory = (
            t * (2 * s.q_heads + 4 * s.kv_heads) * s.d * self.b / (self.bw * p.attn_decode_bw_eff)
        )
        return np.where(t > 0, np.maximum(compute, memory) + p.attn_prefill_latency_s, 0.0)

    def all_reduce_once_time(self, nbytes: Any, workers: int | None = None) -> Any:
        """Seconds of one ring all-reduce of ``nbytes`` over ``workers`` (default ``tp``)."""
        n = self.tp if workers is None else workers
        b = np.asarray(nbytes, dtype=np.float64)
        if n <= 1:
            return b * 0.0
        p = self.params
        link = self.gpu.link_bytes_per_s(n)
        if self.gpu.uses_nvlink(n):
            link *= p.allreduce_link_eff
        return p.allreduce_latency_s + 2 * (n - 1) / n * b / link

    @property
    def num_all_reduces(self) -> int:
        """All-reduces per iteration: two per layer plus the vocabulary-parallel embedding."""
        return 2 * self.model.num_layers + 1 if self.tp > 1 else 0

    def all_reduce_time(self, tokens: Any) -> Any:
        """Seconds of an iteration's tensor-parallel all-reduces for ``tokens`` tokens."""
        t = np.asarray(tokens, dtype=np.float64)
        if self.tp == 1:
            return t * 0.0
        nbytes = t * self.s.h * self.b
        return np.where(t > 0, self.num_all_reduces * self.all_reduce_once_time(nbytes), 0.0)

    # ------------------------------------------------------------------ CostModel

    def _time(self, stats: BatchStats, ctx: Any, work: Any) -> Any:
        """The iteration time with the decode context sum and prefill work given separately
        (floats or arrays), so that runs priced at once equal iterations priced one by one."""
        tokens = stats.num_prefill_tokens + stats.num_decode
        L = self.model.num_layers
        t = (
            self.params.iteration_overhead_s
            + self.non_attention_time(tokens)
            + self.lm_head_time(stats.num_decode + stats.num_prefill_seqs)
            + self.all_reduce_time(tokens)
        )
        if stats.num_decode:
            t = t + L * self.decode_attention_layer_time(stats.num_decode, ctx)
        if stats.num_prefill_tokens:
            t = t + L * self.prefill_attention_layer_time(stats.num_prefill_tokens, work)
        return t

    def batch_time(self, stats: BatchStats) -> float:
        """Seconds of one iteration: the sum of its operator groups (see the module doc)."""
        if stats.total_tokens == 0:
            return 0.0
        return float(self._time(stats, stats.decode_context_sum, stats.prefill_attn_work))

    def run_times(
        self, stats: BatchStats, steps: int, prefill_work_step: int = 0
    ) -> NDArray[np.float64]:
        """Vectorised :meth:`CostModel.run_times`: bit-identical to pricing each step."""
        if stats.total_tokens == 0:
            return np.zeros(steps)
        j = np.arange(steps, dtype=np.float64)
        ctx = stats.decode_context_sum + j * stats.num_decode
        work = stats.prefill_attn_work + j * prefill_work_step
        out = self._time(stats, ctx, work)
        return np.broadcast_to(np.asarray(out, dtype=np.float64), (steps,)).copy()

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over the replica (KV-head replication included)."""
        return self.model.kv_bytes_per_token_tp(self.tp)

    def swap_time(self, num_tokens: int) -> float:
        """PCIe time for ``num_tokens`` of KV; every GPU moves its shard over its own link."""
        if num_tokens <= 0:
            return 0.0
        rate = self.gpu.pcie_gb_per_s * 1e9 * self.tp
        return self.params.swap_latency_s + num_tokens * self.kv_bytes_per_token / rate

    # ------------------------------------------------------------------ summaries

    def compute_time(self, stats: BatchStats) -> float:
        """Seconds the iteration's FLOPs take at the efficiency-scaled peak (no memory, no
        latencies): the compute side of the roofline, for sanity checks and reports."""
        m, s, p = self.model, self.s, self.params
        tokens = stats.total_tokens
        k = m.experts_per_token
        per_token = 2 * (
            s.h * (s.q_heads + 2 * s.kv_heads) * s.d
            + s.q_heads * s.d * s.h
            + k * (s.up_mult + 1) * s.h * s.inter
        )
        gemm = m.num_layers * tokens * per_token / (self.flops * p.gemm_flops_eff)
        attn = (
            m.num_layers
            * 4
            * s.q_heads
            * s.d
            * (
                stats.prefill_attn_work / (self.flops * p.attn_prefill_flops_eff)
                + stats.decode_context_sum / (self.flops * p.gemm_flops_eff)
            )
        )
        return float(gemm + attn)


# ---------------------------------------------------------------------- linearisation


@dataclass(frozen=True)
class Linearisation:
    """Linear coefficients of a roofline model and how far they are from it."""

    coefficients: LinearCoefficients
    max_tokens: int
    floor_tokens: int
    """Token count whose roofline time is the floor (1, or the MoE saturation batch)."""
    non_attention_max_rel_err: float
    """Largest |linear − roofline| / roofline of the non-attention term over
    ``floor_tokens``..``max_tokens``."""
    non_attention_median_rel_err: float
    single_token_rel_err: float
    """(linear − roofline) / roofline at 1 token (> 0 for MoE models: an overestimate)."""

    def report(self) -> dict[str, Any]:
        """A JSON-able summary for a profile's fit report."""
        return {
            "max_tokens": self.max_tokens,
            "floor_tokens": self.floor_tokens,
            "non_attention_max_rel_err": round(self.non_attention_max_rel_err, 4),
            "non_attention_median_rel_err": round(self.non_attention_median_rel_err, 4),
            "single_token_rel_err": round(self.single_token_rel_err, 4),
        }


def _sig(v: float, sig: int = 6) -> float:
    return float(f"{v:.{sig}g}")


def moe_saturation_tokens(model: ModelSpec, fraction: float = 0.9) -> int:
    """Smallest batch whose tokens touch, on average, ``fraction`` of a MoE layer's experts
    (1 for a dense model)."""
    if not model.is_moe:
        return 1
    k, e = model.experts_per_token, model.num_experts
    if k >= e:
        return 1
    return max(1, math.ceil(math.log(1.0 - fraction) / math.log(1.0 - k / e)))


def linear_coefficients(rm: RooflineCostModel, max_tokens: int = 8192) -> Linearisation:
    """Linearise ``rm`` into :class:`LinearCoefficients`.

    * Non-attention: ``token_floor`` is the roofline at 1 token (weight reads dominate);
      the line is the roofline's compute-bound asymptote, through its values at
      ``max_tokens/2`` and ``max_tokens``. The roofline is a sum of per-GEMM maxima whose
      knees are all near the GPU's ridge point, so ``max(floor, line)`` follows it closely;
      the error over 1..``max_tokens`` is reported. MoE models: the weights read grow with
      the batch until its tokens touch every expert, a rise a floor and a line cannot
      follow; the floor is taken at the batch that touches 90% of the experts on average
      (:func:`moe_saturation_tokens`, 9 tokens for 2 of 8 experts), so smaller batches are
      overestimated (``single_token_rel_err`` in the report; use
      :meth:`ReplicaProfile.roofline` where single-request MoE latency matters).
    * Decode attention is linear in ``Σ context`` and the number of requests (memory bound),
      prefill attention linear in ``Σ c·(c+ctx)`` (the per-token memory term of prefill
      attention is dropped: it matters only for chunks of a few tokens).
    * All-reduce: ``(2L+1) × (latency + ring bytes / link)`` is linear in the tokens.
    * LM head: its weight read goes into ``intercept`` (with the per-iteration overhead) and
      its per-row compute into ``per_decode_seq`` and ``per_prefill_seq`` (a sum where the
      roofline takes a max: an overestimate of at most the smaller of the two).
    """
    if max_tokens < 4:
        raise ValueError("max_tokens must be >= 4")
    m, s, p = rm.model, rm.s, rm.params
    L = m.num_layers

    def f(t: Any) -> Any:
        return rm.non_attention_time(t)

    t0 = min(moe_saturation_tokens(m), max_tokens // 4)
    floor = float(f(t0))
    t1, t2 = max_tokens / 2, float(max_tokens)
    slope = (float(f(t2)) - float(f(t1))) / (t2 - t1)
    intercept = float(f(t2)) - slope * t2
    grid = np.unique(np.geomspace(t0, max_tokens, 200).round())
    lin = np.maximum(floor, intercept + slope * grid)
    rel = np.abs(lin - f(grid)) / f(grid)
    one = float(f(1))
    single = (max(floor, intercept + slope) - one) / one

    kv_bytes = 2 * s.kv_heads * s.d * rm.b
    seq_bytes = (2 * s.q_heads + 2 * s.kv_heads) * s.d * rm.b
    per_kv = max(
        kv_bytes / (rm.bw * p.attn_decode_bw_eff),
        4 * s.q_heads * s.d / (rm.flops * p.gemm_flops_eff),
    )
    lm_intercept = lm_per_seq = 0.0
    if p.include_lm_head and s.vocab:
        lm_intercept = s.h * s.vocab * rm.b / (rm.bw * p.gemm_bw_eff) + p.kernel_latency_s
        lm_per_seq = max(
            2 * s.h * s.vocab / (rm.flops * p.gemm_flops_eff),
            (s.h + s.vocab) * rm.b / (rm.bw * p.gemm_bw_eff),
        )
    comm_intercept = comm_per_token = 0.0
    if rm.tp > 1:
        comm_intercept = rm.num_all_reduces * float(rm.all_reduce_once_time(0.0))
        comm_per_token = rm.num_all_reduces * (
            float(rm.all_reduce_once_time(s.h * rm.b)) - float(rm.all_reduce_once_time(0.0))
        )
    coeffs = LinearCoefficients(
        intercept=_sig(p.iteration_overhead_s + lm_intercept),
        token_floor=_sig(floor),
        token_intercept=_sig(intercept),
        per_token=_sig(slope),
        decode_intercept=_sig(L * p.attn_decode_latency_s),
        per_decode_seq=_sig(L * seq_bytes / (rm.bw * p.attn_decode_bw_eff) + lm_per_seq),
        per_decode_kv=_sig(L * per_kv),
        prefill_intercept=_sig(L * p.attn_prefill_latency_s),
        per_prefill_seq=_sig(lm_per_seq),
        per_prefill_work=_sig(L * 4 * s.q_heads * s.d / (rm.flops * p.attn_prefill_flops_eff)),
        comm_intercept=_sig(comm_intercept),
        comm_per_token=_sig(comm_per_token),
    )
    return Linearisation(
        coefficients=coeffs,
        max_tokens=max_tokens,
        floor_tokens=t0,
        single_token_rel_err=single,
        non_attention_max_rel_err=float(rel.max()),
        non_attention_median_rel_err=float(np.median(rel)),
    )
