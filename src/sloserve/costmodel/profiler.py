"""Measure real forward passes of a causal LM and write them as a profile CSV.

:func:`profile_model` times iterations of a Llama-style model on CPU or CUDA and returns
one row per measured batch in the format :func:`sloserve.costmodel.fit.fit_profile_csv`
fits (documented in :mod:`sloserve.costmodel.fit`, *Measured-iteration CSVs*)::

    df = profile_model(tiny_llama_spec())          # seconds on a laptop CPU
    write_profile_csv(df, "tiny.csv")
    coefficients, report = fit_profile_csv("tiny.csv")

PyTorch is imported lazily (``import sloserve.costmodel.profiler`` works without it) and
through :mod:`importlib`, so the module type-checks with or without torch installed: torch
values are ``Any`` here. The model is therefore written functionally (weights in a plain
object, ``torch.nn.functional`` ops) rather than as ``nn.Module`` subclasses.

What one measurement is (how it maps to the simulator's iteration)
------------------------------------------------------------------
The simulator charges ``CostModel.batch_time(stats)`` per engine iteration: one forward pass
over every token scheduled in it. A measurement is exactly that forward pass, vLLM-style:
the iteration's tokens are **packed** into one ``[T, hidden]`` tensor (no padding), so every
non-attention operator (embedding, RMSNorms, fused QKV projection, rotary embedding, output
projection, gated MLP, residual adds) runs once over ``T`` tokens, and attention runs per
sequence group against that group's KV cache: all decode requests with the same cached
context in one ``scaled_dot_product_attention`` call (one query each), every prefill chunk
in its own call (``c`` queries over ``ctx + c`` keys, causal). The new tokens' K and V are
written into the cache inside the measured time. The LM head runs on the last token of every
sequence (what a sampler needs), not on every prefill token. **Included**: that whole forward
pass including the LM head. **Excluded**: sampling, detokenisation, scheduling and input
preparation (token ids, positions, masks and the caches are built before the clock starts),
and the host↔device copy of the inputs. Those are CPU-side costs the simulator's
``intercept`` could carry; they are not measured here.

Choices
-------
* The cached context is **random KV** (timing does not depend on the values), allocated
  before timing. Each layer gets its own cache unless one iteration's caches would exceed
  ``kv_memory_gib``; then all layers share one layer's cache. Reads are the same size either
  way; the switch only happens for caches far beyond any on-chip cache, where sharing
  changes nothing measurable.
* Prefill chunks are causal "bottom-right" (query ``i`` of a chunk after ``ctx`` cached
  tokens sees keys ``0..ctx+i``), expressed with torch's ``causal_lower_right`` bias rather
  than a dense mask where the installed torch supports it, so that on CUDA every chunk runs
  in the fused kernels (flash / memory-efficient) a FlashAttention-based engine would use.
* Decode requests read ``ctx`` cached tokens plus their own new one;
  ``decode_context_sum = Σ ctx`` and ``prefill_attn_work = Σ c·(c + ctx)``, exactly as
  ``engine.instance`` builds :class:`~sloserve.costmodel.base.BatchStats`. Decode rows are
  measured only at contexts ≥ 1 (a decode always has its prompt cached).
* Timing: CUDA uses ``torch.cuda.synchronize`` around the pass and CUDA events (no
  synchronisation inside the pass); CPU uses ``time.perf_counter``. Each shape gets
  ``warmup`` unmeasured passes then ``repeats`` measured ones; the row reports the **median
  repeat** (by total time; the lower median for an even count) with that same repeat's group
  times, so the groups never add up to more than the total. ``time_min_s`` and
  ``time_max_s`` keep the spread.
* Per-group times (``measure_groups``): ``time_decode_attention_s`` and
  ``time_prefill_attention_s`` are the summed time of the attention calls (cache write,
  attention, output copy) of each kind; ``time_non_attention_s`` is the rest of the pass.
  On CUDA each attention call is bracketed by events; on CPU by ``perf_counter``. TP is 1,
  so there is no ``time_comm_s``.
* Hugging Face models (a local path; needs ``transformers``, imported lazily, and loads with
  ``local_files_only=True``) are timed as a whole (no per-group times) through the model's
  own forward with a ``past_key_values`` cache built by a forward over random context
  tokens and copied before every measured pass. Only prefill-only shapes with one chunk and
  decode-only shapes with one shared context are supported there (HF forward takes one
  padded rectangle); others are skipped. HF computes logits for every input position unless
  the installed version accepts ``logits_to_keep``/``num_logits_to_keep``, which we pass.
"""

from __future__ import annotations

import copy
import importlib
import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import ModelSpec
from sloserve.costmodel.base import BatchStats
from sloserve.costmodel.fit import (
    CSV_GROUP_COLUMNS,
    CSV_INPUT_COLUMNS,
    CSV_TIME_COLUMN,
    DEVICE_COLUMN_PREFIX,
    MODEL_COLUMN_PREFIX,
)

GIB = 1024**3

DEFAULT_PREFILL_CHUNKS: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
DEFAULT_DECODE_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONTEXTS: tuple[int, ...] = (0, 128, 512, 1024)

ROPE_THETA = 10000.0
RMS_EPS = 1e-5

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


def _torch() -> Any:
    """The ``torch`` module, or a ConfigError saying how to install it."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise ConfigError(
            "profiling needs PyTorch: pip install 'sloserve[profile]' (torch>=2.1)"
        ) from None


# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class IterationShape:
    """One iteration to measure: prefill chunks and decode requests.

    ``prefill`` holds ``(chunk tokens, cached context)`` per prefill sequence; ``decode``
    holds the cached context of each decode request.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.prefill and not self.decode:
            raise ConfigError("an iteration shape needs a prefill chunk or a decode request")
        for c, ctx in self.prefill:
            if c < 1 or ctx < 0:
                raise ConfigError(f"prefill chunk {c} with context {ctx}: need c >= 1, ctx >= 0")
        if any(ctx < 1 for ctx in self.decode):
            raise ConfigError("a decode request needs a cached context >= 1")

    @property
    def stats(self) -> BatchStats:
        """The aggregates the simulator would compute for this iteration."""
        return BatchStats(
            num_prefill_tokens=sum(c for c, _ in self.prefill),
            num_prefill_seqs=len(self.prefill),
            prefill_attn_work=sum(c * (c + ctx) for c, ctx in self.prefill),
            num_decode=len(self.decode),
            decode_context_sum=sum(self.decode),
        )

    @property
    def kind(self) -> str:
        """``prefill``, ``decode`` or ``hybrid``."""
        if self.prefill and self.decode:
            return "hybrid"
        return "prefill" if self.prefill else "decode"

    @property
    def max_position(self) -> int:
        """The longest sequence (cached + new tokens) in the iteration."""
        return max([c + ctx for c, ctx in self.prefill] + [ctx + 1 for ctx in self.decode])


def profile_grid(
    prefill_chunks: Sequence[int] = DEFAULT_PREFILL_CHUNKS,
    decode_batches: Sequence[int] = DEFAULT_DECODE_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    hybrid: bool = True,
) -> list[IterationShape]:
    """The shapes :func:`profile_model` measures by default.

    Prefill: one chunk of every size at every context. Decode: every batch size at every
    context ≥ 1 (all requests the same context). Hybrid (``hybrid=True``): every decode batch
    size at the largest context together with every chunk size at context 0, which checks
    that the terms add up in the mixed batches chunked-prefill schedulers build.
    """
    if any(c < 1 for c in prefill_chunks) or any(b < 1 for b in decode_batches):
        raise ConfigError("prefill chunks and decode batch sizes must be >= 1")
    if any(ctx < 0 for ctx in contexts):
        raise ConfigError("contexts must be >= 0")
    shapes = [IterationShape(prefill=((c, ctx),)) for c in prefill_chunks for ctx in contexts]
    dec_ctx = [ctx for ctx in contexts if ctx >= 1]
    shapes += [IterationShape(decode=(ctx,) * b) for b in decode_batches for ctx in dec_ctx]
    if hybrid and dec_ctx:
        top = max(dec_ctx)
        shapes += [
            IterationShape(prefill=((c, 0),), decode=(top,) * b)
            for b in decode_batches
            for c in prefill_chunks
        ]
    return shapes


# --------------------------------------------------------------------------- model


def tiny_llama_spec(
    *,
    num_layers: int = 2,
    hidden_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vocab_size: int = 256,
    max_context: int = 4096,
    dtype_bytes: int = 4,
    name: str = "tiny-llama",
) -> ModelSpec:
    """A small Llama-shaped :class:`ModelSpec` that profiles on a CPU in seconds."""
    params = llama_param_count(
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
    )
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        params_b=params / 1e9,
        dtype_bytes=dtype_bytes,
        max_context=max_context,
    )


def llama_param_count(
    *,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    vocab_size: int,
    tied_embeddings: bool = False,
    gated_mlp: bool = True,
) -> int:
    """Parameters of a Llama-style model (no biases; untied LM head and gated MLP unless
    told otherwise)."""
    head_dim = hidden_size // num_heads
    attn = hidden_size * head_dim * (2 * num_heads + 2 * num_kv_heads)
    mlp = (3 if gated_mlp else 2) * hidden_size * intermediate_size
    layer = attn + mlp + 2 * hidden_size
    emb = vocab_size * hidden_size
    return num_layers * layer + hidden_size + emb * (1 if tied_embeddings else 2)


def _check_spec(spec: ModelSpec) -> None:
    if spec.hidden_size % spec.num_heads or spec.num_heads % spec.num_kv_heads:
        raise ConfigError(
            f"model {spec.name}: hidden_size must be a multiple of num_heads and num_heads "
            "a multiple of num_kv_heads"
        )
    if spec.head_dim % 2:
        raise ConfigError(f"model {spec.name}: rotary embeddings need an even head_dim")
    if spec.intermediate_size < 1 or spec.vocab_size < 1:
        raise ConfigError(f"model {spec.name}: intermediate_size and vocab_size must be >= 1")
    if getattr(spec, "num_experts", 1) > 1:
        raise ConfigError(
            f"model {spec.name}: the built-in profiling model is dense; profile a mixture of "
            "experts from its Hugging Face checkpoint instead"
        )


@dataclass
class _Layer:
    w_in_norm: Any
    w_qkv: Any
    w_o: Any
    w_post_norm: Any
    w_gate_up: Any
    w_down: Any


class LlamaModel:
    """A minimal Llama-style causal LM (random weights) for timing forward passes.

    RMSNorm, fused QKV with grouped-query attention over a KV cache, rotary embeddings,
    a SiLU-gated MLP (plain SiLU MLP if ``spec.gated_mlp`` is false), an LM head (tied to
    the embedding if ``spec.tied_embeddings``). Weights are plain tensors and the forward
    pass is functional, which is all a timing needs (see the module docstring).
    """

    def __init__(
        self, spec: ModelSpec, *, device: str = "cpu", dtype: str = "float32", seed: int = 0
    ) -> None:
        _check_spec(spec)
        torch = _torch()
        self.torch = torch
        self.F = importlib.import_module("torch.nn.functional")
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = getattr(torch, _DTYPES[dtype])
        gen = torch.Generator(device="cpu").manual_seed(seed)
        h, d = spec.hidden_size, spec.head_dim
        nq, nkv, inter = spec.num_heads, spec.num_kv_heads, spec.intermediate_size

        def w(rows: int, cols: int) -> Any:
            t = torch.randn(rows, cols, generator=gen) * (cols**-0.5)
            return t.to(device=self.device, dtype=self.dtype)

        def ones(n: int) -> Any:
            return torch.ones(n, device=self.device, dtype=self.dtype)

        self.gated = bool(getattr(spec, "gated_mlp", True))
        self.tied = bool(getattr(spec, "tied_embeddings", False))
        self.embed = w(spec.vocab_size, h)
        self.layers = [
            _Layer(
                w_in_norm=ones(h),
                w_qkv=w((nq + 2 * nkv) * d, h),
                w_o=w(h, nq * d),
                w_post_norm=ones(h),
                w_gate_up=w((2 if self.gated else 1) * inter, h),
                w_down=w(h, inter),
            )
            for _ in range(spec.num_layers)
        ]
        self.final_norm = ones(h)
        self.lm_head = self.embed if self.tied else w(spec.vocab_size, h)
        inv = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(spec.max_context, dtype=torch.float32), inv)
        self.cos = ang.cos().to(device=self.device, dtype=self.dtype)
        self.sin = ang.sin().to(device=self.device, dtype=self.dtype)
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
        self.native_gqa = (major, minor) >= (2, 5)
        self.lower_right = self._probe_lower_right()

    def _probe_lower_right(self) -> Callable[[int, int], Any] | None:
        """torch's bottom-right causal bias, if this version can use it here.

        It expresses "chunk after cached context" without a dense mask, so on CUDA such
        chunks run in the same fused kernels (flash / memory-efficient) as fresh ones.
        """
        try:
            bias = importlib.import_module("torch.nn.attention.bias").causal_lower_right
            q = self.torch.zeros(1, self.spec.num_heads, 2, self.spec.head_dim)
            k = self.torch.zeros(1, self.spec.num_kv_heads, 3, self.spec.head_dim)
            self._sdpa(
                q.to(self.device, self.dtype),
                *(k.to(self.device, self.dtype),) * 2,
                bias(2, 3),
                False,
            )
        except Exception:  # any failure: fall back to a dense boolean mask
            return None
        return bias  # type: ignore[no-any-return]

    @property
    def num_parameters(self) -> int:
        """Parameter count of the weights actually allocated."""
        tensors = [self.embed, self.final_norm] + ([] if self.tied else [self.lm_head])
        tensors += [t for lay in self.layers for t in vars(lay).values()]
        return int(sum(t.numel() for t in tensors))

    # ------------------------------------------------------------------ one iteration

    def prepare(self, shape: IterationShape, seed: int = 0, kv_memory_gib: float = 2.0) -> Any:
        """Inputs and KV caches for ``shape``, built before any clock starts."""
        torch, spec = self.torch, self.spec
        if shape.max_position > spec.max_context:
            raise ConfigError(
                f"shape reaches position {shape.max_position} > max_context {spec.max_context}"
            )
        gen = torch.Generator(device="cpu").manual_seed(seed)
        nkv, d = spec.num_kv_heads, spec.head_dim
        segments: list[tuple[str, int, int, int]] = []  # (kind, start, n tokens, ctx)
        positions: list[int] = []
        last: list[int] = []
        start = 0
        by_ctx: dict[int, int] = {}
        for ctx in shape.decode:
            by_ctx[ctx] = by_ctx.get(ctx, 0) + 1
        for ctx, b in sorted(by_ctx.items()):
            segments.append(("decode", start, b, ctx))
            positions += [ctx] * b
            last += list(range(start, start + b))
            start += b
        for c, ctx in shape.prefill:
            segments.append(("prefill", start, c, ctx))
            positions += list(range(ctx, ctx + c))
            last.append(start + c - 1)
            start += c
        n_tokens = start

        def cache_shape(kind: str, n: int, ctx: int) -> tuple[int, ...]:
            return (n, nkv, ctx + 1, d) if kind == "decode" else (1, nkv, ctx + n, d)

        elem = torch.tensor([], dtype=self.dtype).element_size()
        per_layer = sum(
            2 * int(np.prod(cache_shape(k, n, ctx))) * elem for k, _, n, ctx in segments
        )
        layers = spec.num_layers if per_layer * spec.num_layers <= kv_memory_gib * GIB else 1

        dev_gen = torch.Generator(device=self.device).manual_seed(seed)

        def rand(sh: tuple[int, ...]) -> Any:
            # Filled in place on the device (large caches never cross the host link); uniform
            # is cheaper than normal and, like it, has no NaN or denormal values.
            t = torch.empty(*sh, device=self.device, dtype=self.dtype)
            return t.uniform_(-1.0, 1.0, generator=dev_gen)

        caches = [
            [
                (rand(cache_shape(k, n, ctx)), rand(cache_shape(k, n, ctx)))
                for k, _, n, ctx in segments
            ]
            for _ in range(layers)
        ]
        masks: list[Any] = []
        for kind, _, n, ctx in segments:
            if kind == "decode" or (ctx == 0 and self.lower_right is None):
                masks.append(None)  # one query sees everything / plain causal
            elif self.lower_right is not None:
                masks.append(self.lower_right(n, ctx + n))
            else:
                i = torch.arange(n).unsqueeze(1)
                j = torch.arange(ctx + n).unsqueeze(0)
                masks.append((j <= ctx + i).to(self.device))
        pos = torch.tensor(positions, dtype=torch.long)
        return {
            "ids": torch.randint(0, spec.vocab_size, (n_tokens,), generator=gen).to(self.device),
            "cos": self.cos[pos.to(self.device)],
            "sin": self.sin[pos.to(self.device)],
            "segments": segments,
            "caches": caches,
            "masks": masks,
            "last": torch.tensor(last, dtype=torch.long).to(self.device),
        }

    def _rms(self, x: Any, w: Any) -> Any:
        xf = x.float()
        xf = xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return xf.to(self.dtype) * w

    def _rope(self, x: Any, cos: Any, sin: Any) -> Any:
        # x: [T, heads, d]; the rotate-half convention of Llama / HF.
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return self.torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def _sdpa(self, q: Any, k: Any, v: Any, mask: Any, causal: bool) -> Any:
        rep = self.spec.num_heads // self.spec.num_kv_heads
        if not self.native_gqa:  # torch < 2.5 has no enable_gqa: expand the KV heads
            if rep > 1:
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            return self.F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return self.F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=rep > 1
        )

    def forward(self, inp: Any, timer: _GroupTimer | None = None) -> Any:
        """One packed forward pass; returns the last-token logits of every sequence."""
        F, spec = self.F, self.spec
        nq, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        x = F.embedding(inp["ids"], self.embed)
        n_tokens = x.shape[0]
        caches = inp["caches"]
        for li, lay in enumerate(self.layers):
            h = self._rms(x, lay.w_in_norm)
            qkv = F.linear(h, lay.w_qkv)
            q = qkv[:, : nq * d].view(n_tokens, nq, d)
            k = qkv[:, nq * d : (nq + nkv) * d].view(n_tokens, nkv, d)
            v = qkv[:, (nq + nkv) * d :].view(n_tokens, nkv, d)
            q = self._rope(q, inp["cos"], inp["sin"])
            k = self._rope(k, inp["cos"], inp["sin"])
            out = x.new_empty(n_tokens, nq, d)
            layer_caches = caches[li % len(caches)]
            for (kind, s, n, ctx), (kc, vc), mask in zip(
                inp["segments"], layer_caches, inp["masks"], strict=True
            ):
                mark = timer.start() if timer is not None else None
                if kind == "decode":
                    kc[:, :, ctx] = k[s : s + n]
                    vc[:, :, ctx] = v[s : s + n]
                    o = self._sdpa(q[s : s + n].unsqueeze(2), kc, vc, None, False)
                    out[s : s + n] = o.squeeze(2)
                else:
                    kc[0, :, ctx : ctx + n] = k[s : s + n].transpose(0, 1)
                    vc[0, :, ctx : ctx + n] = v[s : s + n].transpose(0, 1)
                    qq = q[s : s + n].transpose(0, 1).unsqueeze(0)
                    o = self._sdpa(qq, kc, vc, mask, mask is None)
                    out[s : s + n] = o[0].transpose(0, 1)
                if timer is not None:
                    timer.stop(kind, mark)
            x = x + F.linear(out.view(n_tokens, nq * d), lay.w_o)
            h = self._rms(x, lay.w_post_norm)
            if self.gated:
                gate, up = F.linear(h, lay.w_gate_up).chunk(2, dim=-1)
                x = x + F.linear(F.silu(gate) * up, lay.w_down)
            else:
                x = x + F.linear(F.silu(F.linear(h, lay.w_gate_up)), lay.w_down)
        x = self._rms(x[inp["last"]], self.final_norm)
        return F.linear(x, self.lm_head)


# --------------------------------------------------------------------------- timing


class _Clock:
    """perf_counter on CPU; CUDA events (read after one synchronize) on CUDA."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.cuda = device.type == "cuda"
        self.device = device

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def mark(self) -> Any:
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a: Any, b: Any) -> float:
        """Elapsed seconds between two marks (call after :meth:`sync` on CUDA)."""
        if self.cuda:
            return float(a.elapsed_time(b)) / 1e3
        return float(b - a)


@dataclass
class _GroupTimer:
    """Brackets attention calls inside a forward pass, by kind."""

    clock: _Clock
    spans: list[tuple[str, Any, Any]] = field(default_factory=list)

    def start(self) -> Any:
        return self.clock.mark()

    def stop(self, kind: str, mark: Any) -> None:
        self.spans.append((kind, mark, self.clock.mark()))

    def totals(self) -> dict[str, float]:
        out = {"decode": 0.0, "prefill": 0.0}
        for kind, a, b in self.spans:
            out[kind] += self.clock.seconds(a, b)
        return out


@dataclass(frozen=True)
class _Sample:
    total: float
    groups: dict[str, float] | None


class _Runner:
    """Times iteration shapes on one model (ours or a Hugging Face one)."""

    spec: ModelSpec
    dtype_name: str
    supports_groups: bool = True

    def supports(self, shape: IterationShape) -> bool:
        """Whether this runner can build ``shape``."""
        raise NotImplementedError

    def prepare(self, shape: IterationShape) -> Any:
        """Inputs and caches for ``shape`` (untimed)."""
        raise NotImplementedError

    def run(self, prepared: Any, clock: _Clock, groups: bool) -> _Sample:
        """One timed forward pass."""
        raise NotImplementedError


class _OwnRunner(_Runner):
    def __init__(self, model: LlamaModel, kv_memory_gib: float, seed: int) -> None:
        self.model = model
        elem = model.torch.tensor([], dtype=model.dtype).element_size()
        self.spec = model.spec.model_copy(update={"dtype_bytes": elem})
        self.dtype_name = str(model.dtype).removeprefix("torch.")
        self.kv_memory_gib = kv_memory_gib
        self.seed = seed

    def supports(self, shape: IterationShape) -> bool:
        return True

    def prepare(self, shape: IterationShape) -> Any:
        return self.model.prepare(shape, self.seed, self.kv_memory_gib)

    def run(self, prepared: Any, clock: _Clock, groups: bool) -> _Sample:
        timer = _GroupTimer(clock) if groups else None
        clock.sync()
        t0 = clock.mark()
        self.model.forward(prepared, timer)
        t1 = clock.mark()
        clock.sync()
        return _Sample(clock.seconds(t0, t1), timer.totals() if timer is not None else None)


class _HFRunner(_Runner):
    supports_groups = False

    def __init__(self, path: str, device: Any, dtype: Any, seed: int) -> None:
        torch = _torch()
        try:
            tf = importlib.import_module("transformers")
        except ImportError:
            raise ConfigError(
                f"profiling the model at {path} needs transformers (pip install transformers); "
                "or profile a ModelSpec with the built-in model"
            ) from None
        try:
            self.model = tf.AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, torch_dtype=dtype
            )
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: cannot load a causal LM ({str(e).splitlines()[0]})") from e
        self.model.to(device).eval()
        self.torch, self.device, self.seed = torch, device, seed
        self.cache_cls = getattr(tf, "DynamicCache", None)
        cfg = self.model.config
        params = int(sum(p.numel() for p in self.model.parameters()))
        self.spec = ModelSpec(
            name=str(getattr(cfg, "_name_or_path", "") or Path(path).name),
            num_layers=int(cfg.num_hidden_layers),
            hidden_size=int(cfg.hidden_size),
            num_heads=int(cfg.num_attention_heads),
            num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
            intermediate_size=int(getattr(cfg, "intermediate_size", 0) or 0),
            vocab_size=int(getattr(cfg, "vocab_size", 0) or 0),
            params_b=params / 1e9,
            dtype_bytes=torch.tensor([], dtype=dtype).element_size(),
            max_context=int(getattr(cfg, "max_position_embeddings", 4096) or 4096),
        )
        self.dtype_name = str(dtype).removeprefix("torch.")
        # Newer forwards take **kwargs and would silently ignore an unknown keyword, so
        # a keyword counts as supported only when the logits really shrink to one position.
        self.keep_kw: dict[str, int] = {}
        ids = torch.zeros((1, 2), dtype=torch.long, device=device)
        for kw in ("logits_to_keep", "num_logits_to_keep"):
            try:
                with torch.inference_mode():
                    logits = self.model(input_ids=ids, **{kw: 1}).logits
            except (TypeError, ValueError):
                continue
            if logits.shape[1] == 1:
                self.keep_kw = {kw: 1}
                break

    def supports(self, shape: IterationShape) -> bool:
        return (len(shape.prefill) == 1 and not shape.decode) or (
            not shape.prefill and len(set(shape.decode)) == 1
        )

    def prepare(self, shape: IterationShape) -> Any:
        torch = self.torch
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        vocab = max(self.spec.vocab_size, 2)
        if shape.prefill:
            new, ctx = shape.prefill[0]
            b = 1
        else:
            ctx, b, new = shape.decode[0], len(shape.decode), 1
        past = None
        if ctx:
            ids = torch.randint(0, vocab, (b, ctx), generator=gen).to(self.device)
            # An explicit cache object where the version has one (tuples are deprecated).
            cache = self.cache_cls() if self.cache_cls is not None else None
            with torch.inference_mode():
                out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
            past = out.past_key_values
        return torch.randint(0, vocab, (b, new), generator=gen).to(self.device), past

    def run(self, prepared: Any, clock: _Clock, groups: bool) -> _Sample:
        ids, past = prepared
        kv = copy.deepcopy(past)  # the forward appends to the cache it is given
        clock.sync()
        t0 = clock.mark()
        with self.torch.inference_mode():
            self.model(input_ids=ids, past_key_values=kv, use_cache=True, **self.keep_kw)
        t1 = clock.mark()
        clock.sync()
        return _Sample(clock.seconds(t0, t1), None)


# --------------------------------------------------------------------------- profiling


def _device_facts(torch: Any, device: Any) -> tuple[str, float]:
    """(name, memory GiB) of the device, for the metadata columns."""
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return str(props.name), float(props.total_memory) / GIB
    name = platform.processor() or platform.machine() or "cpu"
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        mem = 0.0
    return f"cpu ({name}, {torch.get_num_threads()} threads)", float(mem)


def _resolve_device(torch: Any, device: str) -> Any:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but torch.cuda.is_available() is False")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu or cuda[:N], got {device!r}")
    return dev


def _measure(
    runner: _Runner,
    grid: Sequence[IterationShape],
    clock: _Clock,
    warmup: int,
    repeats: int,
    groups: bool,
    interleave: bool,
    progress: Callable[[int, int], None] | None,
) -> list[list[_Sample]]:
    """``repeats`` samples per shape, after ``warmup`` unmeasured passes of each.

    Interleaved: every shape is prepared and warmed up, then each of ``repeats`` rounds
    measures every shape once, so a burst of interference (another process, a clock change)
    costs one sample of many shapes, which the median discards, rather than every sample of
    a few. Sequential: shape by shape, holding one shape's inputs at a time.
    """
    torch = _torch()
    total = repeats * len(grid)
    done = 0
    out: list[list[_Sample]] = [[] for _ in grid]

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    with torch.inference_mode():
        if interleave:
            prepared = [runner.prepare(shape) for shape in grid]
            for prep in prepared:
                for _ in range(warmup):
                    runner.run(prep, clock, groups)
            for _ in range(repeats):
                for i, prep in enumerate(prepared):
                    out[i].append(runner.run(prep, clock, groups))
                    tick()
        else:
            for i, shape in enumerate(grid):
                prep = runner.prepare(shape)
                for _ in range(warmup):
                    runner.run(prep, clock, groups)
                for _ in range(repeats):
                    out[i].append(runner.run(prep, clock, groups))
                    tick()
                del prep
    return out


def profile_model(
    spec_or_model: ModelSpec | LlamaModel | str | Path,
    *,
    device: str = "cpu",
    prefill_chunks: Sequence[int] = DEFAULT_PREFILL_CHUNKS,
    decode_batches: Sequence[int] = DEFAULT_DECODE_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    hybrid: bool = True,
    shapes: Iterable[IterationShape] | None = None,
    repeats: int = 5,
    warmup: int = 2,
    dtype: str | None = None,
    measure_groups: bool = True,
    interleave: bool = True,
    cpu_threads: int | None = None,
    kv_memory_gib: float = 2.0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Time forward passes over a grid of iterations; one row per shape (the CSV format).

    ``spec_or_model``: a :class:`ModelSpec` (the built-in Llama-style model with random
    weights is built from it), a :class:`LlamaModel`, or a local Hugging Face model directory
    (needs ``transformers``). ``shapes`` replaces the grid of :func:`profile_grid`
    (``prefill_chunks`` × ``contexts``, ``decode_batches`` × ``contexts``, hybrids).
    ``dtype``: ``float32`` (default on CPU), ``float16`` or ``bfloat16`` (default on CUDA);
    a :class:`LlamaModel` keeps its own.
    ``interleave``: measure in rounds over all shapes (default; holds every shape's inputs at
    once) or shape by shape. ``cpu_threads``: torch's intra-op threads while profiling on CPU
    (restored afterwards; ``None`` keeps the current setting). On a busy or shared CPU use 1:
    a multi-threaded pass stalls whenever one of its threads is descheduled.
    ``progress(done, total)`` is called after every measured pass.
    See the module docstring for what is timed.
    """
    if repeats < 1 or warmup < 0:
        raise ConfigError("repeats must be >= 1 and warmup >= 0")
    torch = _torch()
    dev = _resolve_device(torch, device)
    dtype_name = _DTYPES.get((dtype or ("bfloat16" if dev.type == "cuda" else "float32")).lower())
    if dtype_name is None:
        raise ConfigError(f"dtype must be one of {', '.join(sorted(_DTYPES))}, got {dtype!r}")
    runner: _Runner
    if isinstance(spec_or_model, LlamaModel):
        if spec_or_model.device != dev:
            raise ConfigError(f"the model is on {spec_or_model.device}, profiling on {dev}")
        runner = _OwnRunner(spec_or_model, kv_memory_gib, seed)
    elif isinstance(spec_or_model, ModelSpec):
        model = LlamaModel(spec_or_model, device=str(dev), dtype=dtype_name, seed=seed)
        runner = _OwnRunner(model, kv_memory_gib, seed)
    else:
        runner = _HFRunner(str(spec_or_model), dev, getattr(torch, dtype_name), seed)
    grid = (
        list(shapes)
        if shapes is not None
        else profile_grid(prefill_chunks, decode_batches, contexts, hybrid)
    )
    grid = [s for s in grid if runner.supports(s)]
    too_long = [s for s in grid if s.max_position > runner.spec.max_context]
    if too_long:
        raise ConfigError(
            f"a shape reaches position {too_long[0].max_position}, beyond the model's "
            f"max_context {runner.spec.max_context}"
        )
    if not grid:
        raise ConfigError("no iteration shapes to measure")
    groups = measure_groups and runner.supports_groups
    clock = _Clock(torch, dev)
    threads_before = torch.get_num_threads()
    if cpu_threads is not None and dev.type == "cpu":
        if cpu_threads < 1:
            raise ConfigError(f"cpu_threads must be >= 1, got {cpu_threads}")
        torch.set_num_threads(cpu_threads)
    try:
        dev_name, dev_mem = _device_facts(torch, dev)
        samples = _measure(runner, grid, clock, warmup, repeats, groups, interleave, progress)
    finally:
        torch.set_num_threads(threads_before)
    spec = runner.spec
    rows: list[dict[str, Any]] = []
    for shape, shape_samples in zip(grid, samples, strict=True):
        order = sorted(range(len(shape_samples)), key=lambda j: shape_samples[j].total)
        med = shape_samples[order[(len(order) - 1) // 2]]
        st = shape.stats
        row: dict[str, Any] = {
            "num_prefill_tokens": st.num_prefill_tokens,
            "num_prefill_seqs": st.num_prefill_seqs,
            "prefill_attn_work": st.prefill_attn_work,
            "num_decode": st.num_decode,
            "decode_context_sum": st.decode_context_sum,
            CSV_TIME_COLUMN: med.total,
        }
        if med.groups is not None:
            dec = med.groups["decode"] if st.num_decode else None
            pre = med.groups["prefill"] if st.num_prefill_tokens else None
            row[CSV_GROUP_COLUMNS["decode_attention"]] = dec
            row[CSV_GROUP_COLUMNS["prefill_attention"]] = pre
            row[CSV_GROUP_COLUMNS["non_attention"]] = med.total - (dec or 0.0) - (pre or 0.0)
        row |= {
            "kind": shape.kind,
            "repeats": repeats,
            "time_min_s": shape_samples[order[0]].total,
            "time_max_s": shape_samples[order[-1]].total,
            "device": dev_name,
            DEVICE_COLUMN_PREFIX + "memory_gib": round(dev_mem, 3),
            "dtype": runner.dtype_name,
            "tp": 1,
            "model": spec.name,
        }
        for f in ModelSpec.model_fields:
            if f != "name":
                row[MODEL_COLUMN_PREFIX + f] = getattr(spec, f)
        rows.append(row)
    df = pd.DataFrame(rows)
    first = [*CSV_INPUT_COLUMNS, CSV_TIME_COLUMN]
    return df[first + [c for c in df.columns if c not in first]]


def write_profile_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a profile table (from :func:`profile_model`) as CSV; returns the path.

    Times are written with full precision; empty group cells stay empty.
    """
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(p, index=False, float_format="%.9g")
    except OSError as e:
        raise ConfigError(f"{p}: cannot write profile CSV ({e.strerror})") from e
    return p
