"""A minimal Llama-style causal LM in torch (random weights) whose forward passes we time.

PyTorch is imported lazily, through :mod:`importlib` (:func:`_torch`), so this module
type-checks and imports without torch: torch values are ``Any`` here. The model is written
functionally (weights in a plain object, ``torch.nn.functional`` ops) rather than as
``nn.Module`` subclasses. One forward pass is one engine iteration, packed vLLM-style (see
:mod:`sloserve.costmodel.profiler`).

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
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import ModelSpec
from sloserve.costmodel.profiler.grid import IterationShape
from sloserve.costmodel.profiler.timing import _GroupTimer

GIB = 1024**3

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
    return llama_spec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        dtype_bytes=dtype_bytes,
        max_context=max_context,
    )


def llama_spec(
    *,
    name: str,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    vocab_size: int,
    max_context: int = 4096,
    dtype_bytes: int = 2,
    tied_embeddings: bool = False,
) -> ModelSpec:
    """The :class:`ModelSpec` of a Llama-style model of this shape, with its parameter
    count from :func:`llama_param_count`."""
    params = llama_param_count(
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        tied_embeddings=tied_embeddings,
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
        tied_embeddings=tied_embeddings,
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
        self,
        spec: ModelSpec,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        weights: Mapping[str, Any] | None = None,
        rope_theta: float = ROPE_THETA,
        rms_eps: float = RMS_EPS,
    ) -> None:
        """Random weights from ``seed``, or ``weights`` by our names (``embed``,
        ``final_norm``, ``lm_head``, ``layers.{i}.{w_qkv,...}``; execute mode maps a
        checkpoint onto them, :mod:`sloserve.engine.execute.weights`)."""
        _check_spec(spec)
        torch = _torch()
        self.torch = torch
        self.F = importlib.import_module("torch.nn.functional")
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = getattr(torch, _DTYPES[dtype])
        self.rms_eps = rms_eps
        gen = torch.Generator(device="cpu").manual_seed(seed)
        h, d = spec.hidden_size, spec.head_dim
        nq, nkv, inter = spec.num_heads, spec.num_kv_heads, spec.intermediate_size

        def w(name: str, rows: int, cols: int) -> Any:
            if weights is not None:
                t = weights[name]
                if tuple(t.shape) != (rows, cols):
                    raise ConfigError(
                        f"weight {name}: shape {tuple(t.shape)}, expected {(rows, cols)}"
                    )
            else:
                t = torch.randn(rows, cols, generator=gen) * (cols**-0.5)
            return t.to(device=self.device, dtype=self.dtype)

        def ones(name: str, n: int) -> Any:
            if weights is not None:
                return weights[name].to(device=self.device, dtype=self.dtype)
            return torch.ones(n, device=self.device, dtype=self.dtype)

        self.gated = bool(getattr(spec, "gated_mlp", True))
        self.tied = bool(getattr(spec, "tied_embeddings", False))
        self.embed = w("embed", spec.vocab_size, h)
        self.layers = [
            _Layer(
                w_in_norm=ones(f"layers.{i}.w_in_norm", h),
                w_qkv=w(f"layers.{i}.w_qkv", (nq + 2 * nkv) * d, h),
                w_o=w(f"layers.{i}.w_o", h, nq * d),
                w_post_norm=ones(f"layers.{i}.w_post_norm", h),
                w_gate_up=w(f"layers.{i}.w_gate_up", (2 if self.gated else 1) * inter, h),
                w_down=w(f"layers.{i}.w_down", h, inter),
            )
            for i in range(spec.num_layers)
        ]
        self.final_norm = ones("final_norm", h)
        self.lm_head = self.embed if self.tied else w("lm_head", spec.vocab_size, h)
        inv = 1.0 / (rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
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
        xf = xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.rms_eps)
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
